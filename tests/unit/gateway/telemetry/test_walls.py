"""The KV demand gauges and the binding-wall gauge, read at scrape time (no engines)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from config.fleet import Fleet, parse_fleet
from gateway.telemetry.efficiency import EndpointFacts, TokenLedger, pool_utilisation
from gateway.telemetry.walls import History, PoolCounts, PoolWalls, capacity, kv_facts
from routing.binding_wall import WALLS
from routing.formulas import HardwareRates, ModelShape, RequestTokens
from routing.snapshots import EndpointSnapshot, EngineMetrics, PoolSnapshot
from routing.state.memory import MemoryState
from routing.state.protocol import Ask

A, B = "http://127.0.0.1:1", "http://127.0.0.1:2"
LLAMA = {"params": 8.03e9, "layers": 32, "hidden_size": 4096, "kv_heads": 8, "head_dim": 128,
         "dtype_bytes": 2}
L4 = {"name": "l4", "peak_flops": 121e12, "mem_bandwidth": 300e9, "kv_cache_bytes": 6e9}


def _fleet(**levers: Any) -> Fleet:
    return parse_fleet({"routing": {"features": {"block_tokens": 16}}, "pools": [
        {"name": "p", "engine": "vllm", "models": ["m"], "endpoints": [A, B], "model": LLAMA,
         "hardware": L4, "levers": {"prefix_caching": True, **levers}}]})


def _vllm(blocks: int | None, usage: float = 0.5, preempted: float | None = None
          ) -> EngineMetrics:
    return EngineMetrics(kv_block_size=16 if blocks is not None else None,
                         kv_blocks_total=blocks, kv_cache_usage=usage,
                         preemptions_total=preempted)


def _pool(*metrics: EngineMetrics) -> PoolSnapshot:
    return PoolSnapshot("p", "vllm", "mixed", ("m",), tuple(
        EndpointSnapshot(url, "p", True, m) for url, m in zip((A, B), metrics, strict=False)))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Counts:
    """The telemetry's totals, set by the test."""

    by_pool: dict[str, PoolCounts]

    def __call__(self) -> Mapping[str, PoolCounts]:
        return self.by_pool


def _gauge(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_capacity_is_the_engines_blocks_else_the_fleet_files_bytes() -> None:
    facts = kv_facts(_fleet())["p"]
    assert facts.fallback_tokens == 45_776  # 6e9 B ÷ 131,072 B per token
    fp8 = kv_facts(_fleet(kv_cache_dtype="fp8"))["p"]
    assert fp8.fallback_tokens == 91_552  # 1-byte KV elements: twice the tokens
    pool = _pool(_vllm(256), _vllm(None))
    assert capacity(pool.endpoints, facts) == 256 * 16 + 45_776
    unknown = kv_facts(parse_fleet({"pools": [{"name": "p", "engine": "vllm", "models": ["m"],
                                               "endpoints": [A]}]}))["p"]
    assert capacity(pool.endpoints, unknown) is None  # B says nothing and no facts
    assert capacity((), facts) is None


async def test_demand_is_in_flight_plus_the_working_set_against_capacity() -> None:
    state = MemoryState()
    await state.place(Ask("m", tuple(range(100)), None, [A], tokens=2100), lambda v: Only(A))
    await state.place(Ask("m", tuple(range(50)), None, [B], tokens=900), lambda v: Only(B))
    registry = CollectorRegistry()
    pool = _pool(_vllm(256), _vllm(256))
    registry.register(PoolWalls(lambda: (pool,), _fleet(), Counts({}), lambda: None, state))
    # the index's entries past a chain's 16th block stand for 4 blocks each: the 100-block
    # chain's last one for 4 (block 99 is a stride key), the 50-block chain's for 2, counted 4
    assert _gauge(registry, "ridge_pool_kv_working_set_tokens", pool="p") == (100 + 52) * 16
    assert _gauge(registry, "ridge_pool_kv_demand_tokens", pool="p") == 3000 + 2432
    assert _gauge(registry, "ridge_pool_kv_capacity_tokens", pool="p") == 8192
    assert _gauge(registry, "ridge_pool_kv_demand_ratio", pool="p") == pytest.approx(5432 / 8192)
    assert _gauge(registry, "ridge_pool_kv_bytes_per_token", pool="p") == 131_072


def test_the_wall_reads_the_window_and_names_one_wall() -> None:
    clock, counts = Clock(), Counts({})  # no request counted yet when it is built
    registry = CollectorRegistry()
    pool = _pool(_vllm(256), _vllm(256))
    registry.register(PoolWalls(lambda: (pool,), _fleet(), counts, lambda: None, None,
                                window_s=60.0, clock=clock))

    def walls() -> dict[str, float | None]:
        return {w: _gauge(registry, "ridge_pool_binding_wall", pool="p", wall=w) for w in WALLS}

    assert walls() == {**dict.fromkeys(WALLS, 0.0), "none": 1.0}
    clock.now, counts.by_pool["p"] = 10.0, PoolCounts(predicted=6000, lost=4500)
    assert walls()["kv_capacity"] == 1.0 and sum(v or 0 for v in walls().values()) == 1
    clock.now = 50.0  # no more loss, but the loss between 0 s and 10 s is in the window
    assert walls()["kv_capacity"] == 1.0
    clock.now = 71.0  # the window starts at 11 s: from the sample at 10 s on, nothing lost
    assert walls()["none"] == 1.0


def test_the_window_keeps_the_newest_sample_at_or_before_its_start() -> None:
    history = History()
    for t, lost in ((0.0, 0.0), (30.0, 100.0), (61.0, 300.0), (90.0, 600.0)):
        history.add(t, PoolCounts(lost=lost), 60.0)
    assert history.delta().lost == 500.0  # from the sample at 30 s (≤ 90 − 60)
    assert History().delta() == PoolCounts()


def test_preemptions_count_from_the_first_sample_that_has_them() -> None:
    history = History()
    history.add(0.0, PoolCounts(), 60.0)  # the engines had not been polled yet
    history.add(5.0, PoolCounts(preemptions=7.0), 60.0)
    history.add(9.0, PoolCounts(preemptions=10.0), 60.0)
    assert history.delta().preemptions == 3.0
    history.add(12.0, PoolCounts(preemptions=1.0), 60.0)  # an engine restarted
    assert history.delta().preemptions == 0.0


def test_preempting_full_engines_read_as_the_capacity_wall() -> None:
    clock, registry = Clock(), CollectorRegistry()
    pools = [_pool(_vllm(256, 0.95, 0.0), _vllm(256, 0.5, 0.0))]
    registry.register(PoolWalls(lambda: pools, _fleet(), Counts({}), lambda: None, None,
                                clock=clock))
    assert _gauge(registry, "ridge_pool_binding_wall", pool="p", wall="none") == 1.0
    clock.now, pools[0] = 5.0, _pool(_vllm(256, 0.95, 2.0), _vllm(256, 0.5, 0.0))
    assert _gauge(registry, "ridge_pool_binding_wall", pool="p", wall="kv_capacity") == 1.0


def test_busy_hardware_reads_as_compute_from_ridges_own_accounting() -> None:
    shape = ModelShape(1e9, 2, 4, 1, 2, 2.0)
    facts = {A: EndpointFacts(A, "p", "vllm", shape, HardwareRates(1e12, 1e15))}
    clock = Clock()
    ledger = TokenLedger(facts, window_s=30.0, clock=clock)
    clock.now = 10.0
    # 2 · 1e9 · 5,000 prefill FLOPs = 1e13 over the 10 s since the request arrived: 1e12 FLOP/s
    ledger.observe(A, RequestTokens(5001, 0, 1), e2e_s=10.0, ttft_s=10.0)
    mfu, _ = pool_utilisation(ledger)["p"]
    assert mfu == pytest.approx(1.0, rel=1e-3)
    registry = CollectorRegistry()
    pool = _pool(_vllm(256))
    registry.register(PoolWalls(lambda: (pool,), _fleet(), Counts({}), lambda: ledger,
                                clock=clock))
    assert _gauge(registry, "ridge_pool_binding_wall", pool="p", wall="compute") == 1.0


@dataclass(frozen=True)
class Only:
    url: str

    @property
    def urls(self) -> tuple[str, ...]:
        return (self.url,)


def test_the_drift_from_the_plan_is_the_windows_share_and_wall() -> None:
    clock, counts = Clock(), Counts({})
    fleet = parse_fleet({"pools": [
        {"name": n, "engine": "vllm", "models": ["m"], "endpoints": [u], "model": LLAMA,
         "hardware": L4, "levers": {"prefix_caching": True}} for n, u in (("p", A), ("q", B))],
        "plan": {"source": "t.jsonl", "pools": {"p": {"share": 0.75, "wall": "none"},
                                                "q": {"share": 0.25, "wall": "kv_capacity"}}}})
    pools = (PoolSnapshot("p", "vllm", "mixed", ("m",), (EndpointSnapshot(A, "p", True,
                                                                          _vllm(256)),)),
             PoolSnapshot("q", "vllm", "mixed", ("m",), (EndpointSnapshot(B, "q", True,
                                                                          _vllm(256)),)))
    registry = CollectorRegistry()
    registry.register(PoolWalls(lambda: pools, fleet, counts, lambda: None, None,
                                window_s=60.0, clock=clock))
    assert _gauge(registry, "ridge_plan_share_drift", pool="p") is None  # nothing answered yet
    clock.now, counts.by_pool = 10.0, {"p": PoolCounts(evaluated=50), "q": PoolCounts(evaluated=50)}
    assert _gauge(registry, "ridge_plan_share_drift", pool="p") == pytest.approx(-0.25)
    assert _gauge(registry, "ridge_plan_share_drift", pool="q") == pytest.approx(0.25)
    assert _gauge(registry, "ridge_plan_wall_matches", pool="p") == 1.0  # none, as planned
    assert _gauge(registry, "ridge_plan_wall_matches", pool="q") == 0.0  # planned kv_capacity


def test_a_fleet_without_a_plan_exports_no_drift() -> None:
    registry = CollectorRegistry()
    registry.register(PoolWalls(lambda: (_pool(_vllm(256), _vllm(256)),), _fleet(), Counts({}),
                                lambda: None, None))
    names = {m.name for m in registry.collect()}
    assert "ridge_plan_share_drift" not in names and "ridge_pool_binding_wall" in names
