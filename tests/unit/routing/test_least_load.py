from __future__ import annotations

import pytest

from routing.least_load import candidates, pick_least_loaded
from routing.types import EndpointSnapshot, EngineMetrics, PoolSnapshot


def ep(url: str, in_flight: int = 0, running: float | None = None, waiting: float | None = None,
       healthy: bool = True, pool: str = "p") -> EndpointSnapshot:
    return EndpointSnapshot(url, pool, healthy, in_flight, EngineMetrics(running=running,
                                                                         waiting=waiting))


@pytest.mark.parametrize(
    ("endpoints", "exclude", "expected"),
    [
        ([ep("a", 2), ep("b", 1)], set(), "b"),
        ([ep("a", 0, running=3), ep("b", 2)], set(), "b"),  # engine counts add to the load
        ([ep("a", 0, waiting=5), ep("b", 0, running=4)], set(), "b"),
        ([ep("a", 1), ep("b", 1)], set(), "a"),  # ties: first listed
        ([ep("a", 0), ep("b", 9)], {"a"}, "b"),  # a retry goes elsewhere
        ([ep("a", 0)], {"a"}, None),
        ([], set(), None),
    ],
)
def test_pick_least_loaded(endpoints: list[EndpointSnapshot], exclude: set[str],
                           expected: str | None) -> None:
    picked = pick_least_loaded(endpoints, frozenset(exclude))
    assert (picked.url if picked else None) == expected


def test_candidates_are_healthy_endpoints_of_mixed_pools_serving_the_model() -> None:
    pools = [
        PoolSnapshot("a", "vllm", "mixed", ("m",), (ep("a1", pool="a"), ep("a2", healthy=False))),
        PoolSnapshot("b", "vllm", "mixed", ("other",), (ep("b1", pool="b"),)),
        PoolSnapshot("c", "vllm", "prefill", ("m",), (ep("c1", pool="c"),)),
        PoolSnapshot("d", "sglang", "mixed", ("m", "x"), (ep("d1", pool="d"),)),
    ]
    assert [e.url for e in candidates(pools, "m")] == ["a1", "d1"]
