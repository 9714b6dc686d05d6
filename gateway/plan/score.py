"""What a candidate's replay is worth: goodput, latency percentiles, cache hits, MFU/MBU, cost.

:func:`score` reads an :class:`~gateway.plan.evaluate.Evaluation` against the SLO. A request
is *good* when it was answered (HTTP 200, every token) within both bounds: TTFT ≤ ``ttft_s``
and TPOT ≤ ``tpot_s`` (:func:`routing.formulas.evaluate`; a refusal or an error is never good).
Units: goodput in good requests per second over the offered load's window, first arrival to
last (:func:`routing.formulas.goodput_rate`; the span to the last answer for a trace of one
instant), so a fleet that serves every request well reaches the trace's own rate; latencies
[s] over the answered requests; the prefix-cache hit rate is prompt tokens found in the
cache ÷ prompt tokens looked up, over the pools that compute prompts (a decode pool receives
its KV); MFU and MBU are the fleet's FLOPs and bytes over span × GPUs × the accelerator's peak
(:func:`routing.formulas.mfu`); cost per million tokens is the GPU-hours of the span at
``price_per_gpu_hour`` ÷ the output tokens of the good requests, in millions. See
docs/planning.md#what-a-plan-is-scored-on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from config.engines import Role
from config.fleet import Fleet
from gateway.plan.evaluate import Evaluation
from routing.binding_wall import WALLS
from routing.formulas import Bounds, Measured, evaluate, goodput_rate, mbu, mfu

OBJECTIVES = ("goodput", "goodput_per_dollar", "cost_per_mtok", "ttft_p99")
"""What the search maximises (goodput, goodput per dollar) or minimises (cost per million
tokens, p99 TTFT)."""


@dataclass(frozen=True, slots=True)
class PoolScore:
    """One pool: its engines, the share of all requests it answered, its most-named wall."""

    name: str
    engines: int
    share: float
    wall: str


@dataclass(frozen=True, slots=True)
class Score:
    """A candidate's figures (units in the module docstring)."""

    gpus: int
    requests: int
    answered: int
    good: int
    span_s: float
    goodput: float
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    tpot_p99: float
    hit_rate: float
    mfu: float
    mbu: float
    cost_per_mtok: float
    pools: tuple[PoolScore, ...]

    @property
    def goodput_per_gpu(self) -> float:
        return self.goodput / self.gpus if self.gpus else 0.0

    @property
    def good_share(self) -> float:
        return self.good / self.requests if self.requests else 0.0

    def holds(self, attainment: float) -> bool:
        """Whether the fleet held the SLO: at least ``attainment`` of its requests good."""
        return self.good_share >= attainment

    def objective(self, name: str, price_per_gpu_hour: float) -> float:
        """The figure the search maximises for objective ``name`` (minimised ones negated)."""
        if name == "goodput":
            return self.goodput
        if name == "goodput_per_dollar":
            return self.goodput / max(self.gpus * price_per_gpu_hour, 1e-12)
        if name == "cost_per_mtok":
            return -self.cost_per_mtok
        if name == "ttft_p99":
            return -self.ttft_p99 if self.answered else -math.inf
        raise ValueError(f"unknown objective {name!r}; known: {', '.join(OBJECTIVES)}")


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``values`` by the nearest rank; NaN for none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def score(ev: Evaluation, fleet: Fleet, bounds: Bounds, price_per_gpu_hour: float) -> Score:
    """``ev`` of ``fleet`` read against ``bounds`` (module docstring)."""
    answered = [s for s in ev.served if s.ttft_s is not None]
    good = [s for s in ev.served if evaluate(bounds, Measured(
        s.status if s.ttft_s is not None else 503, s.e2e_s, s.ttft_s, s.tpot_s)).good]
    gpus = sum(len(p.endpoints) for p in fleet.pools)
    hardware = fleet.pools[0].hardware
    assert hardware is not None, "a planned fleet names its accelerator"
    rates = hardware.to_rates()
    busy_s = max(ev.span_s, 1e-9) * max(gpus, 1)
    computing = [c for name, c in ev.pools.items() if _role(fleet, name) is not Role.DECODE]
    queried = sum(c.queried_tokens for c in computing)
    good_tokens = sum(s.output_tokens for s in good)
    gpu_hours = gpus * ev.span_s / 3600.0
    return Score(
        gpus=gpus, requests=len(ev.served), answered=len(answered), good=len(good),
        span_s=ev.span_s,
        goodput=goodput_rate(len(good), ev.window_s if ev.window_s > 0 else ev.span_s),
        ttft_p50=percentile([s.ttft_s for s in answered if s.ttft_s is not None], 0.5),
        ttft_p99=percentile([s.ttft_s for s in answered if s.ttft_s is not None], 0.99),
        tpot_p50=percentile([s.tpot_s for s in answered if s.tpot_s is not None], 0.5),
        tpot_p99=percentile([s.tpot_s for s in answered if s.tpot_s is not None], 0.99),
        hit_rate=sum(c.hit_tokens for c in computing) / queried if queried else 0.0,
        mfu=mfu(sum(c.flops for c in ev.pools.values()) / busy_s, rates),
        mbu=mbu(sum(c.read_bytes for c in ev.pools.values()) / busy_s, rates),
        cost_per_mtok=(gpu_hours * price_per_gpu_hour / (good_tokens / 1e6)
                       if good_tokens else math.inf),
        pools=tuple(_pool_scores(ev, fleet)),
    )


def _role(fleet: Fleet, pool: str) -> Role | None:
    return next((p.role for p in fleet.pools if p.name == pool), None)


def _pool_scores(ev: Evaluation, fleet: Fleet) -> list[PoolScore]:
    answered: dict[str, int] = {}
    for s in ev.served:
        if s.ttft_s is not None:
            answered[s.pool] = answered.get(s.pool, 0) + 1
    for p in fleet.pools:  # a decode pool answers what its prefill pool was chosen for
        if p.pair is not None and p.role is Role.PREFILL:
            answered[p.pair] = answered.get(p.name, 0)
    total = max(len(ev.served), 1)
    return [PoolScore(p.name, len(p.endpoints), answered.get(p.name, 0) / total,
                      _most_named(ev.walls.get(p.name, {})))
            for p in fleet.pools]


def _most_named(walls: Mapping[str, int]) -> str:
    """The wall named most often (ties: the first of :data:`routing.binding_wall.WALLS`);
    ``-`` when the pool was never busy at a scrape."""
    if not walls:
        return "-"
    return min(walls, key=lambda w: (-walls[w], WALLS.index(w) if w in WALLS else len(WALLS)))
