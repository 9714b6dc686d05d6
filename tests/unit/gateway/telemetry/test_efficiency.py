"""ridge's MFU/MBU accounting: worked numbers, the collector, and agreement with the simulator.

The simulator prices every engine step with the roofline and exports the totals as vLLM's
``estimated_*_per_gpu_total`` counters; ridge estimates the same work from what a gateway sees
(usage token counts and token timings). Here both run on the simulator's virtual clock, so the
comparison is exact and needs no sleeping.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from backends.registry.endpoints import EndpointRegistry
from backends.registry.status import PollResult
from backends.sim.engine import EngineCore
from backends.sim.request import SimRequest
from config.fleet import parse_fleet
from config.pools import Pool
from gateway.telemetry.efficiency import (
    WINDOW_S,
    EfficiencyCollector,
    EndpointFacts,
    EngineHistory,
    TokenLedger,
    Totals,
    endpoint_facts,
    engine_totals,
)
from routing.formulas import HardwareRates, ModelShape, RequestTokens
from routing.policy import LeverPolicy
from routing.router import Router
from routing.scheduler import build_scheduler
from routing.snapshots import EndpointSnapshot, EngineMetrics, PoolSnapshot
from tests.unit.backends.sim.sim_helpers import make_core, make_pool, make_request
from tests.unit.routing.scheduler.snapshots import features, view

TOY = ModelShape(params=1e9, layers=2, hidden_size=4, kv_heads=1, head_dim=2, dtype_bytes=2)
A, B = "http://127.0.0.1:1", "http://127.0.0.1:2"


def _facts(engine: str = "vllm") -> dict[str, EndpointFacts]:
    return {url: EndpointFacts(url, "p", engine, TOY, HardwareRates(1e12, 1e11))
            for url in (A, B)}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# -- the ledger, by hand ----------------------------------------------------------------------

# P = 10, C = 4, G = 3 on TOY (see test_fleet_math in routing for the arithmetic)
PREFILL_FLOPS = 2e9 * 6 + 1440
DECODE_FLOPS = 2e9 * 2 + 736
WEIGHTS = 2e9  # N · w, read once per engine step


def test_one_request_is_priced_with_one_weight_read_per_step() -> None:
    ledger = TokenLedger(_facts(), clock=Clock())
    ledger.observe(A, RequestTokens(10, 4, 3), e2e_s=2.0, ttft_s=1.0, at=10.0)
    totals = ledger.totals(A)
    assert totals.flops == pytest.approx(PREFILL_FLOPS + DECODE_FLOPS)
    # KV read 16·10 (prefill) + 16·23 (decodes), and 3 steps of weights (1 prefill + 2 decode)
    assert totals.read == pytest.approx(160 + 368 + 3 * WEIGHTS)
    assert totals.write == pytest.approx(16 * 6 + 16 * 2)
    assert ledger.totals(B) == Totals()


def test_rates_spread_decode_work_over_its_interval() -> None:
    clock = Clock()
    ledger = TokenLedger(_facts(), window_s=0.5, clock=clock)
    ledger.observe(A, RequestTokens(10, 4, 3), e2e_s=2.0, ttft_s=1.0, at=10.0)
    # window [9.25, 9.75]: half of the decodes (spread over [9, 10]), not the prefill (at 9.0)
    rates = ledger.rates(A, now=9.75)
    assert rates.flops == pytest.approx(0.5 * DECODE_FLOPS / 0.5)
    assert rates.read == pytest.approx(0.5 * (368 + 2 * WEIGHTS) / 0.5)
    assert ledger.rates(A, now=100.0) == Totals()  # long gone from the window


def test_a_young_ledger_divides_by_its_age_not_the_whole_window() -> None:
    clock = Clock()
    ledger = TokenLedger(_facts(), window_s=60.0, clock=clock)
    ledger.observe(A, RequestTokens(10, 4, 3), e2e_s=2.0, ttft_s=1.0, at=10.0)
    assert ledger.rates(A, now=10.0).flops == pytest.approx((PREFILL_FLOPS + DECODE_FLOPS) / 10)


def test_a_prefill_decode_pair_splits_the_work() -> None:
    ledger = TokenLedger(_facts(), clock=Clock())
    ledger.observe(A, RequestTokens(10, 4, 3), 2.0, 1.0, decode_url=B, at=10.0)
    assert ledger.totals(A).flops == pytest.approx(PREFILL_FLOPS)
    assert ledger.totals(B).flops == pytest.approx(DECODE_FLOPS)


def test_an_unknown_endpoint_is_ignored() -> None:
    ledger = TokenLedger(_facts(), clock=Clock())
    ledger.observe("http://elsewhere", RequestTokens(10, 0, 3), 2.0, 1.0, at=10.0)
    assert ledger.totals(A) == Totals()


# -- the engine's own counters ----------------------------------------------------------------


def test_engine_history_rates_and_restarts() -> None:
    history = EngineHistory()
    history.add(0.0, Totals(100.0, 10.0, 1.0), window_s=60.0)
    assert history.rate() is None
    history.add(10.0, Totals(1100.0, 110.0, 11.0), window_s=60.0)
    assert history.rate() == Totals(100.0, 10.0, 1.0)
    history.add(20.0, Totals(50.0, 5.0, 0.5), window_s=60.0)  # the engine restarted
    assert history.rate() is None


def test_engine_history_keeps_only_the_window() -> None:
    history = EngineHistory()
    for t in range(100):
        history.add(float(t), Totals(float(t * t)), window_s=10.0)
    rate = history.rate()
    assert rate is not None and rate.flops == pytest.approx((99**2 - 89**2) / 10)
    assert len(history.samples) <= 12


def test_engine_totals_are_read_where_the_dialect_has_them() -> None:
    assert engine_totals(EngineMetrics()) is None  # SGLang without the counters
    assert engine_totals(EngineMetrics(estimated_flops_total=0.0)) == Totals()
    assert engine_totals(EngineMetrics(estimated_flops_total=5.0, estimated_read_bytes_total=2.0)
                         ) == Totals(5.0, 2.0)


# -- the collector ------------------------------------------------------------------------------


@dataclass
class FakeRegistry:
    """The endpoint registry's snapshot, with engine totals the test sets."""

    engine: dict[str, EngineMetrics] = field(default_factory=dict)

    def snapshot(self) -> tuple[PoolSnapshot, ...]:
        eps = tuple(EndpointSnapshot(u, "p", True, self.engine.get(u, EngineMetrics()))
                    for u in (A, B))
        return (PoolSnapshot("p", "vllm", "mixed", ("m",), eps),)


def _gauges(metrics: CollectorRegistry, name: str) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    for family in metrics.collect():
        for s in family.samples:
            if s.name == name:
                out[tuple(s.labels[k] for k in sorted(s.labels))] = s.value
    return out


def test_collector_exports_both_sources_and_pool_aggregates() -> None:
    clock, fake = Clock(), FakeRegistry()
    ledger = TokenLedger(_facts(), window_s=10.0, clock=clock)
    metrics = CollectorRegistry()
    metrics.register(EfficiencyCollector(ledger, fake.snapshot))
    clock.now = 10.0
    fake.engine[A] = EngineMetrics(estimated_flops_total=1e12, estimated_read_bytes_total=1e11,
                                   estimated_write_bytes_total=1e10)
    metrics.collect()  # first sample of the engine's totals
    list(metrics.collect())
    clock.now = 20.0
    fake.engine[A] = EngineMetrics(estimated_flops_total=6e12, estimated_read_bytes_total=3e11,
                                   estimated_write_bytes_total=2e10)
    # 5e12 FLOP in 10 s = 5e11 FLOP/s of a 1e12 peak; (2e11 + 1e10) B in 10 s of 1e11 B/s
    mfu = _gauges(metrics, "ridge_mfu_ratio")
    assert mfu[(A, "p", "engine")] == pytest.approx(0.5)
    assert mfu[(A, "p", "ridge")] == 0.0 and mfu[(B, "p", "ridge")] == 0.0
    assert (B, "p", "engine") not in mfu  # B does not estimate
    assert _gauges(metrics, "ridge_mbu_ratio")[(A, "p", "engine")] == pytest.approx(0.21)
    pool = _gauges(metrics, "ridge_pool_mfu_ratio")
    assert pool[("p", "engine")] == pytest.approx(0.5)  # only A has the engine source
    assert pool[("p", "ridge")] == 0.0
    flops = _gauges(metrics, "ridge_estimated_flops_total")
    assert flops[(A, "p", "engine")] == 6e12
    assert _gauges(metrics, "ridge_hardware_peak_flops_per_second") == {("p",): 1e12}


def test_zeros_are_no_estimate_but_a_zero_baseline_counts() -> None:
    clock, fake = Clock(), FakeRegistry()
    ledger = TokenLedger(_facts(), window_s=60.0, clock=clock)
    metrics = CollectorRegistry()
    metrics.register(EfficiencyCollector(ledger, fake.snapshot))
    zero = EngineMetrics(estimated_flops_total=0.0, estimated_read_bytes_total=0.0,
                         estimated_write_bytes_total=0.0)
    fake.engine = {A: zero, B: zero}  # both idle, or not estimating: cannot tell yet
    for t in (0.0, 10.0):
        clock.now = t
        assert (A, "p", "engine") not in _gauges(metrics, "ridge_mfu_ratio")
    clock.now = 20.0
    fake.engine[A] = EngineMetrics(estimated_flops_total=2e12, estimated_read_bytes_total=0.0)
    mfu = _gauges(metrics, "ridge_mfu_ratio")
    assert mfu[(A, "p", "engine")] == pytest.approx(2e12 / 20 / 1e12)  # from the t=0 zero
    assert (B, "p", "engine") not in mfu  # still all zeros: vLLM without --enable-mfu-metrics


def test_pool_mfu_is_total_achieved_over_total_peak() -> None:
    clock = Clock()
    ledger = TokenLedger(_facts(), window_s=10.0, clock=clock)
    metrics = CollectorRegistry()
    metrics.register(EfficiencyCollector(ledger, FakeRegistry().snapshot))
    list(metrics.collect())  # the first scrape, at 0: the gauges' span starts here
    clock.now = 10.0
    ledger.observe(A, RequestTokens(10, 4, 3), 2.0, 1.0, at=10.0)
    mfu = _gauges(metrics, "ridge_mfu_ratio")
    pool = _gauges(metrics, "ridge_pool_mfu_ratio")
    assert mfu[(A, "p", "ridge")] == pytest.approx((PREFILL_FLOPS + DECODE_FLOPS) / 10 / 1e12)
    assert pool[("p", "ridge")] == pytest.approx(mfu[(A, "p", "ridge")] / 2)


# -- agreement with the simulator's own FLOPs and bytes ----------------------------------------


@dataclass
class Run:
    """A virtual-time run: finished requests, each one's token times, and the engine's
    cumulative (time, FLOPs, bytes read, bytes written) after every step."""

    requests: list[SimRequest]
    token_times: dict[str, list[float]]
    samples: list[tuple[float, Totals]]

    def gaps(self, rid: str) -> list[float]:
        times = self.token_times[rid]
        return [b - a for a, b in zip(times, times[1:], strict=False)]

    def engine_at(self, t: float) -> Totals:
        return max((s for s in self.samples if s[0] <= t), key=lambda s: s[0])[1]


def _arrivals(n: int, rate: float, prompt: int, out: int, shared_prefix: bool
              ) -> list[tuple[float, SimRequest]]:
    rng, t, arrivals = random.Random(7), 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        prefix = "You are a helpful assistant. " * 40 if shared_prefix else ""
        req = make_request(f"r{i}", rng.randint(prompt // 2, prompt * 3 // 2),
                           rng.randint(out // 2, out * 3 // 2), prefix=prefix, fill=f"{i}x")
        arrivals.append((t, req))
    return arrivals


def _simulate(core: EngineCore, arrivals: Sequence[tuple[float, SimRequest]]) -> Run:
    """backends.sim.virtual.simulate, keeping the engine's totals after every step."""
    pending, now, i = list(arrivals), 0.0, 0
    times: dict[str, list[float]] = {}
    samples = [(0.0, Totals())]
    for _ in range(200_000):
        while i < len(pending) and pending[i][0] <= now:
            pending[i][1].arrival = pending[i][0]
            core.add(pending[i][1])
            i += 1
        out = core.step(now)
        if out.idle:
            nxt = [t for t in (pending[i][0] if i < len(pending) else None,
                               core.next_event_time(now)) if t is not None]
            if not nxt:
                break
            now = max(now, min(nxt))
            continue
        now += out.seconds
        for e in out.emissions:
            times.setdefault(e.request.rid, []).append(now)
        st = core.stats
        samples.append((now, Totals(st.flops, st.read_bytes, st.write_bytes)))
    return Run([r for _, r in arrivals], times, samples)


def _ledger_for(pool: Pool, clock: Clock, window_s: float) -> TokenLedger:
    facts = EndpointFacts(A, pool.name, pool.engine.value, pool.model.to_shape(),
                          pool.hardware.to_rates(),
                          pool.levers.chunked_prefill.token_budget
                          if pool.levers.chunked_prefill else None)
    return TokenLedger({A: facts}, window_s=window_s, clock=clock)


def _feed(ledger: TokenLedger, run: Run, streamed: bool = True) -> None:
    """Record each request at its finish time, in finishing order, as the proxy would: the
    engine's usage (prompt, cached, completion tokens) and, for streams, the token timings."""
    for req in sorted(run.requests, key=lambda r: r.finished_at or 0.0):
        assert req.finished_at is not None and req.first_token_at is not None
        tokens = RequestTokens.clamped(req.prompt_tokens, req.cached_tokens, req.generated)
        ledger.observe(A, tokens, req.finished_at - req.arrival,
                       req.first_token_at - req.arrival if streamed else None,
                       gaps=run.gaps(req.rid) if streamed else (), at=req.finished_at)


CASES = [
    pytest.param("vllm", {}, 120, 20.0, 500, 100, False, id="vllm-busy"),
    pytest.param("vllm", {}, 40, 2.0, 500, 100, False, id="vllm-light"),
    pytest.param("vllm", {"prefix_caching": True}, 100, 20.0, 500, 100, True, id="vllm-prefix"),
    pytest.param("vllm", {"chunk": 512}, 80, 10.0, 3000, 100, False, id="vllm-chunked"),
    pytest.param("vllm", {"spec_k": 4}, 30, 2.0, 500, 100, False, id="vllm-speculative"),
    pytest.param("sglang", {"prefix_caching": True}, 100, 20.0, 500, 100, True, id="sglang"),
]


@pytest.mark.parametrize(("engine", "levers", "n", "rate", "prompt", "out", "shared"), CASES)
def test_ridge_totals_agree_with_the_simulators_within_ten_percent(
    engine: str, levers: dict[str, Any], n: int, rate: float, prompt: int, out: int,
    shared: bool,
) -> None:
    pool = make_pool(engine=engine, model="llama-3-8b", hardware="a100-80gb", **levers)
    run = _simulate(make_core(pool), _arrivals(n, rate, prompt, out, shared))
    ledger = _ledger_for(pool, Clock(), window_s=1e9)
    _feed(ledger, run)
    ridge, engine_total = ledger.totals(A), run.samples[-1][1]
    assert ridge.flops == pytest.approx(engine_total.flops, rel=0.10)
    assert ridge.read == pytest.approx(engine_total.read, rel=0.10)
    assert ridge.write == pytest.approx(engine_total.write, rel=0.10)


def test_mfu_and_mbu_gauges_agree_with_the_simulators_over_a_window() -> None:
    pool = make_pool(engine="vllm", model="llama-3-8b", hardware="a100-80gb",
                     prefix_caching=True)
    run = _simulate(make_core(pool), _arrivals(150, 20.0, 500, 100, True))
    end = run.samples[-1][0]
    window = end / 2
    clock, engine = Clock(), FakeRegistry()
    ledger = _ledger_for(pool, clock, window_s=window)
    metrics = CollectorRegistry()
    metrics.register(EfficiencyCollector(ledger, engine.snapshot))
    clock.now = end - window  # a first scrape, half way: the engine's totals then
    engine.engine[A] = _metrics(run.engine_at(clock.now))
    list(metrics.collect())
    clock.now = end  # the second, after every request finished and was recorded
    _feed(ledger, run)
    engine.engine[A] = _metrics(run.engine_at(end))
    # the gauges cover the last half of the run: [end - window, end]
    mfu, mbu = _gauges(metrics, "ridge_mfu_ratio"), _gauges(metrics, "ridge_mbu_ratio")
    assert mfu[(A, "p", "ridge")] == pytest.approx(mfu[(A, "p", "engine")], rel=0.10)
    assert mbu[(A, "p", "ridge")] == pytest.approx(mbu[(A, "p", "engine")], rel=0.10)
    assert 0.0 < mbu[(A, "p", "engine")] < 1.0


def _metrics(totals: Totals) -> EngineMetrics:
    return EngineMetrics(estimated_flops_total=totals.flops or None,
                         estimated_read_bytes_total=totals.read,
                         estimated_write_bytes_total=totals.write)


def test_without_token_times_light_load_still_agrees() -> None:
    # non-streamed answers: no token times; decode steps are taken as evenly spread
    pool = make_pool(engine="vllm", model="llama-3-8b", hardware="a100-80gb")
    run = _simulate(make_core(pool), _arrivals(40, 2.0, 500, 100, False))
    ledger = _ledger_for(pool, Clock(), window_s=1e9)
    _feed(ledger, run, streamed=False)
    assert ledger.totals(A).read == pytest.approx(run.samples[-1][1].read, rel=0.10)


# -- a pool without model or hardware facts: routed, left out of MFU/MBU, said once ----------


def test_a_pool_without_facts_routes_and_is_skipped_with_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    full = {"name": "full", "engine": "vllm", "models": ["a"], "endpoints": [A],
            "model": "llama-3-8b", "hardware": "nvidia-l4"}
    bare = {"name": "bare", "engine": "vllm", "models": ["b"], "endpoints": [B]}
    fleet = parse_fleet({"pools": [full, bare]})
    endpoints = EndpointRegistry(fleet, clock=Clock())
    for url in (A, B):
        endpoints.record_poll(url, PollResult(endpoints.now(), healthy=True))
    pools = endpoints.snapshot()
    assert [p.ridge_tokens > 0 for p in pools] == [True, False]  # unknown without facts
    router = Router(LeverPolicy(fleet.policy_config()),
                    {p.name: build_scheduler(fleet.scheduler_config(p.name)) for p in fleet.pools})
    plan = router.choose(features(model="b"), pools, view())
    assert plan is not None and plan.decision.pool == "bare" and plan.first.url == B

    with caplog.at_level("INFO", logger="gateway.telemetry.efficiency"):
        facts = endpoint_facts(fleet)
    lines = [r.getMessage() for r in caplog.records if r.name == "gateway.telemetry.efficiency"]
    assert lines == ["pool 'bare': MFU/MBU off, the fleet file gives no model and no hardware "
                     "facts"]
    assert list(facts) == [A]

    clock = Clock()
    ledger = TokenLedger(facts, clock=clock)
    ledger.observe(B, RequestTokens.clamped(100, 0, 10), 1.0, 0.1)  # not priced, no error
    metrics = CollectorRegistry()
    metrics.register(EfficiencyCollector(ledger, endpoints.snapshot))
    clock.now = 1.0
    pools_seen = {s.labels.get("pool") for f in metrics.collect() for s in f.samples}
    assert pools_seen == {"full"}


def test_the_first_scrape_after_traffic_reads_it_and_idle_falls_to_0_after_a_window() -> None:
    clock = Clock()
    ledger = TokenLedger(_facts(), clock=clock)
    assert ledger.window_s == WINDOW_S == 30.0
    metrics = CollectorRegistry()
    metrics.register(EfficiencyCollector(ledger, FakeRegistry().snapshot))
    clock.now = 20.0
    ledger.observe(A, RequestTokens(10, 4, 3), 2.0, 1.0, at=20.0)
    clock.now = 21.0  # never scraped before, traffic over: since the request came, at 18 s
    first = _gauges(metrics, "ridge_mfu_ratio")[(A, "p", "ridge")]
    assert first == pytest.approx((PREFILL_FLOPS + DECODE_FLOPS) / 3 / 1e12)
    clock.now = 48.5  # a window since it came, idle since 20 s: the work in [18.5, 48.5]
    assert _gauges(metrics, "ridge_mfu_ratio")[(A, "p", "ridge")] == pytest.approx(
        (PREFILL_FLOPS + DECODE_FLOPS) / 30 / 1e12)
    clock.now = 50.5  # one window after the last work
    assert _gauges(metrics, "ridge_mfu_ratio")[(A, "p", "ridge")] == 0.0
