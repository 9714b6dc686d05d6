from __future__ import annotations

import pytest

from routing.state import LoadCounts, StateView
from routing.types import EndpointSnapshot, EngineMetrics, PoolSnapshot
from routing.workload import EndpointLoad, PoolLoad, endpoint_load, pool_load, pool_loads


def ep(url: str, in_flight: int = 0, running: float | None = None,
       waiting: float | None = None, kv: float | None = None,
       healthy: bool = True) -> EndpointSnapshot:
    return EndpointSnapshot(url, "p", healthy, in_flight,
                            EngineMetrics(running=running, waiting=waiting, kv_cache_usage=kv))


@pytest.mark.parametrize(
    ("snapshot", "counts", "expected", "concurrency"),
    [
        (ep("a"), None, EndpointLoad("a", True, 0, 0, 0.0, 0.0, None), 0.0),
        # the shared state counts more gateways than this one's snapshot
        (ep("a", in_flight=2, running=3, waiting=1, kv=0.4), LoadCounts(5, 900),
         EndpointLoad("a", True, 5, 900, 3.0, 1.0, 0.4), 5.0),
        # this gateway's own count is live; the state's may lag
        (ep("a", in_flight=4), LoadCounts(1, 10), EndpointLoad("a", True, 4, 10, 0.0, 0.0, None),
         4.0),
        # clients bypassing the gateway: the engine's count is the larger
        (ep("a", in_flight=1, running=6, waiting=2), LoadCounts(1, 50),
         EndpointLoad("a", True, 1, 50, 6.0, 2.0, None), 8.0),
    ],
)
def test_endpoint_load_joins_gateway_counts_with_engine_gauges(
    snapshot: EndpointSnapshot, counts: LoadCounts | None, expected: EndpointLoad,
    concurrency: float,
) -> None:
    view = StateView(load={snapshot.url: counts}) if counts else StateView()
    got = endpoint_load(snapshot, view)
    assert got == expected
    assert got.concurrency == concurrency


def test_a_plain_load_table_works_as_the_source() -> None:
    assert endpoint_load(ep("a"), {"a": LoadCounts(2, 30)}).tokens_in_flight == 30
    assert endpoint_load(ep("a"), {}).tokens_in_flight == 0


POOL = PoolSnapshot("gen", "vllm", "mixed", ("m",), (
    ep("a", in_flight=2, running=2, waiting=0, kv=0.30),
    ep("b", in_flight=0, running=5, waiting=3, kv=0.85),
    ep("c", in_flight=9, running=9, waiting=9, kv=0.99, healthy=False),
    ep("d"),
))
VIEW = StateView(load={"a": LoadCounts(3, 1200), "b": LoadCounts(1, 800),
                       "c": LoadCounts(9, 9000)})


@pytest.mark.parametrize(
    ("pool", "view", "expected"),
    [
        # healthy a, b, d: requests 3+1+0, tokens 1200+800, running 2+5, waiting 0+3,
        # concurrency max(3, 2) + max(1, 8) + 0 = 11; c is unhealthy and left out
        (POOL, VIEW, PoolLoad("gen", 4, 2000, 7.0, 3.0, 0.85, 3, 4, 11.0)),
        (POOL, StateView(), PoolLoad("gen", 2, 0, 7.0, 3.0, 0.85, 3, 4, 10.0)),
        (PoolSnapshot("empty", "sglang", "mixed", ("m",), ()), VIEW,
         PoolLoad("empty", 0, 0, 0.0, 0.0, None, 0, 0, 0.0)),
        (PoolSnapshot("down", "vllm", "mixed", ("m",), (ep("c", 9, healthy=False),)), VIEW,
         PoolLoad("down", 0, 0, 0.0, 0.0, None, 0, 1, 0.0)),
    ],
)
def test_pool_load_sums_the_healthy_endpoints(pool: PoolSnapshot, view: StateView,
                                              expected: PoolLoad) -> None:
    assert pool_load(pool, view) == expected


@pytest.mark.parametrize(("load", "expected"), [
    (PoolLoad("p", 4, 2000, 0, 0, None, 4, 4, 4), 500.0),
    (PoolLoad("p", 4, 2000, 0, 0, None, 0, 4, 4), 0.0),
])
def test_tokens_per_endpoint(load: PoolLoad, expected: float) -> None:
    assert load.tokens_per_endpoint == expected


def test_pool_loads_by_name() -> None:
    other = PoolSnapshot("radix", "sglang", "mixed", ("m",), (ep("r"),))
    assert sorted(pool_loads([POOL, other], VIEW)) == ["gen", "radix"]
    assert pool_loads([POOL, other], VIEW)["gen"].tokens_in_flight == 2000
