"""Per pool, at scrape time: KV demand against capacity, and the wall that binds.

The arithmetic and the rule are :mod:`routing.binding_wall`'s; :class:`PoolWalls` feeds them
what the gateway already measures, every scrape (nothing on the request path): the router's
in-flight tokens and the prefix index's working set against the pool's KV capacity
(:func:`capacity`), the telemetry's counters and the engines' preemptions over the last
``window_s`` [s] (:data:`WINDOW_S`, :class:`History`), and ridge's own MFU/MBU.

Gauges {pool}: ``ridge_pool_kv_working_set_tokens``, ``ridge_pool_kv_demand_tokens``,
``ridge_pool_kv_capacity_tokens``, ``ridge_pool_kv_demand_ratio``,
``ridge_pool_kv_bytes_per_token``, and ``ridge_pool_binding_wall`` {pool, wall} (1 for the wall
the rule names). With a fleet file's ``plan:`` (:mod:`config.plan_section`), per planned pool
that answered a request in the window: ``ridge_plan_share_drift`` (its share of the window's
answered requests − the planned share) and ``ridge_plan_wall_matches`` (1 when the wall named
is the planned one). See docs/telemetry.md#kv-demand-and-the-binding-wall.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from config.fleet import Fleet
from config.plan_section import PlanSection
from gateway.telemetry.efficiency import TokenLedger, pool_utilisation
from routing.admission.capacity import kv_tokens
from routing.binding_wall import (
    DEFAULT_THRESHOLDS,
    WALLS,
    KvDemand,
    WallSignals,
    WallThresholds,
    binding_wall,
    capacity_tokens,
    kv_demand,
)
from routing.formulas import ModelShape
from routing.load import InFlight, pool_summary
from routing.snapshots import EndpointSnapshot, PoolSnapshot
from routing.window import WorkloadMeasures

WINDOW_S = 60.0
"""The rule's window [s]: four scrapes at Prometheus' usual 15 s interval."""

Snapshot = Callable[[], Sequence[PoolSnapshot]]


class PrefixReadout(Protocol):
    """What the collector reads of the router state at each scrape (synchronous)."""

    def measures(self) -> WorkloadMeasures: ...

    def held_blocks(self) -> Mapping[str, int]: ...


@dataclass(frozen=True, slots=True)
class PoolCounts:
    """One pool's cumulative totals: tokens, requests; ``preemptions`` None = no engine of it
    says."""

    predicted: float = 0.0
    lost: float = 0.0
    prompt: float = 0.0
    cached: float = 0.0
    completion: float = 0.0
    evaluated: float = 0.0
    tpot_violations: float = 0.0
    preemptions: float | None = None


NO_COUNTS = PoolCounts()
Totals = Callable[[], Mapping[str, PoolCounts]]
"""The telemetry's per-pool totals (preemptions left None: the collector adds the engines')."""


@dataclass(frozen=True, slots=True)
class PoolKvFacts:
    """A pool's KV facts from the fleet file: its KV bytes per token [B] and each engine's KV
    cache [B] (None = not given)."""

    shape: ModelShape | None
    kv_cache_bytes: float | None

    @property
    def fallback_tokens(self) -> int | None:
        """One engine's capacity from the facts [tokens], or None."""
        if self.shape is None or self.kv_cache_bytes is None:
            return None
        return capacity_tokens(self.kv_cache_bytes, self.shape)


def kv_facts(fleet: Fleet) -> dict[str, PoolKvFacts]:
    """Per pool name, its :class:`PoolKvFacts` (the KV dtype lever included)."""
    return {pool.name: PoolKvFacts(
        pool.model.to_shape(pool.levers.kv_dtype_bytes) if pool.model is not None else None,
        pool.hardware.kv_cache_bytes if pool.hardware is not None else None)
        for pool in fleet.pools}


@dataclass(slots=True)
class History:
    """Samples (time, totals) of one pool within the window."""

    samples: deque[tuple[float, PoolCounts]] = field(default_factory=deque)

    def add(self, now: float, counts: PoolCounts, window_s: float) -> None:
        self.samples.append((now, counts))
        while len(self.samples) > 2 and self.samples[1][0] <= now - window_s:
            self.samples.popleft()

    def delta(self) -> PoolCounts:
        """Newest − oldest sample (≥ 0 each: an engine that restarted counts from 0);
        preemptions from the oldest sample that has them."""
        if not self.samples:
            return NO_COUNTS
        old, new = self.samples[0][1], self.samples[-1][1]
        since = next((c.preemptions for _, c in self.samples if c.preemptions is not None), None)
        diff = {name: max(0.0, getattr(new, name) - getattr(old, name)) for name in _SUMMED}
        return PoolCounts(**diff, preemptions=None if since is None or new.preemptions is None
                          else max(0.0, new.preemptions - since))


_SUMMED = ("predicted", "lost", "prompt", "cached", "completion", "evaluated", "tpot_violations")
"""The fields of :class:`PoolCounts` that only grow (the telemetry's counters)."""


class PoolWalls(Collector):
    """The KV demand gauges and the binding-wall diagnosis (see the module)."""

    def __init__(self, snapshot: Snapshot, fleet: Fleet, totals: Totals,
                 ledger: Callable[[], TokenLedger | None],
                 state: PrefixReadout | None = None, *, window_s: float = WINDOW_S,
                 thresholds: WallThresholds = DEFAULT_THRESHOLDS,
                 clock: Callable[[], float] = time.monotonic,
                 plan: Callable[[], PlanSection | None] | None = None) -> None:
        self._snapshot, self._totals, self._ledger, self._state = snapshot, totals, ledger, state
        self._plan = plan or (lambda: fleet.plan)
        self._facts = kv_facts(fleet)
        self._block_tokens = fleet.routing.features.block_tokens
        self._window_s, self._thresholds, self._clock = window_s, thresholds, clock
        self._history: dict[str, History] = {}
        now, counts = clock(), totals()
        for pool in fleet.pools:
            self._history[pool.name] = History()
            self._history[pool.name].add(now, counts.get(pool.name, NO_COUNTS), window_s)

    def collect(self) -> Iterator[Metric]:
        now = self._clock()
        pools = tuple(self._snapshot())
        own = self._state.measures().in_flight if self._state is not None else {}
        held = self._state.held_blocks() if self._state is not None else {}
        totals = self._totals()
        ledger = self._ledger()
        use = pool_utilisation(ledger, now) if ledger is not None else {}
        demands: dict[str, KvDemand] = {}
        walls: dict[str, str] = {}
        answered: dict[str, float] = {}
        for pool in pools:
            demand = demands[pool.name] = self.demand(pool, own, held)
            window = self._window(pool, totals.get(pool.name, NO_COUNTS), now)
            answered[pool.name] = window.evaluated
            ratio = demand.ratio if self._state is not None else None
            walls[pool.name] = binding_wall(
                signals(pool, window, ratio, use.get(pool.name)), self._thresholds)
        yield from _kv_families(demands, self._facts, self._state is not None)
        yield _wall_family(walls)
        plan = self._plan()
        if plan is not None:
            yield from _plan_families(plan, answered, walls)

    def demand(self, pool: PoolSnapshot, own: InFlight, held: Mapping[str, int]) -> KvDemand:
        """The pool's KV demand and capacity now (module docstring)."""
        blocks = sum(held.get(ep.url, 0) for ep in pool.endpoints)
        in_flight = pool_summary(pool, own).tokens_in_flight
        facts = self._facts.get(pool.name, PoolKvFacts(None, None))
        return kv_demand(in_flight, blocks, self._block_tokens,
                         capacity(pool.healthy_endpoints, facts))

    def _window(self, pool: PoolSnapshot, counts: PoolCounts, now: float) -> PoolCounts:
        preempted = [p for ep in pool.endpoints
                     if (p := ep.metrics.preemptions_total) is not None]
        sample = replace(counts, preemptions=sum(preempted) if preempted else None)
        history = self._history.get(pool.name)
        if history is None:  # a pool added since (a reload): its counters start from 0
            history = self._history[pool.name] = History()
            history.add(now, NO_COUNTS, self._window_s)
        history.add(now, sample, self._window_s)
        return history.delta()


def capacity(endpoints: Sequence[EndpointSnapshot], facts: PoolKvFacts) -> int | None:
    """Σ KV capacity of ``endpoints`` [tokens]: each engine's blocks × block size, else the
    facts' bytes ÷ bytes per token; None when one endpoint's is unknown, or none is given."""
    total = 0
    for ep in endpoints:
        tokens = kv_tokens(ep.metrics)
        if tokens is None:
            tokens = facts.fallback_tokens
        if tokens is None:
            return None
        total += tokens
    return total if endpoints else None


def signals(pool: PoolSnapshot, window: PoolCounts, demand_ratio: float | None,
            use: tuple[float, float] | None) -> WallSignals:
    """The rule's inputs for ``pool`` over one window (``use``: its MFU and MBU)."""
    usages = [u for ep in pool.healthy_endpoints if (u := ep.metrics.kv_cache_usage) is not None]
    return WallSignals(
        predicted_tokens=window.predicted, lost_tokens=window.lost,
        kv_demand_ratio=demand_ratio, kv_usage=max(usages) if usages else None,
        preemptions=window.preemptions,
        mfu=use[0] if use is not None else None, mbu=use[1] if use is not None else None,
        prefill_tokens=max(0.0, window.prompt - window.cached), decode_tokens=window.completion,
        evaluated=window.evaluated, tpot_violations=window.tpot_violations)


def _kv_families(demands: Mapping[str, KvDemand], facts: Mapping[str, PoolKvFacts],
                 known: bool) -> Iterator[Metric]:
    """The KV gauges; ``known``: the demand is (a router state was read), else only the
    capacity and the facts are exported."""
    labels = ("pool",)
    working = GaugeMetricFamily("ridge_pool_kv_working_set_tokens", "Distinct prompt tokens "
                                "the router's prefix index holds for the pool's endpoints",
                                labels=labels)
    demand = GaugeMetricFamily("ridge_pool_kv_demand_tokens", "KV tokens the pool is asked "
                               "to hold: in flight (prompt + expected output) + working set",
                               labels=labels)
    cap = GaugeMetricFamily("ridge_pool_kv_capacity_tokens", "KV cache capacity of the "
                            "pool's healthy endpoints (tokens)", labels=labels)
    ratio = GaugeMetricFamily("ridge_pool_kv_demand_ratio", "KV demand ÷ KV capacity",
                              labels=labels)
    per_token = GaugeMetricFamily("ridge_pool_kv_bytes_per_token", "KV bytes per token: 2 · "
                                  "layers · KV heads · head dim · KV dtype bytes",
                                  labels=labels)
    for pool, d in sorted(demands.items()):
        if d.capacity is not None:
            cap.add_metric([pool], float(d.capacity))
        if not known:
            continue
        working.add_metric([pool], d.working_set)
        demand.add_metric([pool], d.demand)
        if d.ratio is not None:
            ratio.add_metric([pool], d.ratio)
    for pool, f in sorted(facts.items()):
        if f.shape is not None:
            per_token.add_metric([pool], f.shape.kv_bytes_per_token)
    yield from (working, demand, cap, ratio, per_token)


def _plan_families(plan: PlanSection, answered: Mapping[str, float],
                   walls: Mapping[str, str]) -> Iterator[Metric]:
    """The drift from ``plan`` of the window's shares and walls, for every planned pool that
    answered a request in the window."""
    total = sum(answered.get(name, 0.0) for name in plan.pools)
    drift = GaugeMetricFamily("ridge_plan_share_drift", "the pool's share of the answered "
                              "requests in the window minus the share its plan predicted",
                              labels=("pool",))
    matches = GaugeMetricFamily("ridge_plan_wall_matches", "1 when the wall binding the pool "
                                "is the one its plan predicted, else 0", labels=("pool",))
    for name, planned in sorted(plan.pools.items()):
        if total <= 0 or answered.get(name, 0.0) <= 0:
            continue
        drift.add_metric([name], answered[name] / total - planned.share)
        matches.add_metric([name], 1.0 if walls.get(name) == planned.wall else 0.0)
    yield from (drift, matches)


def _wall_family(walls: Mapping[str, str]) -> Metric:
    family = GaugeMetricFamily("ridge_pool_binding_wall", "1 for the wall that binds the pool "
                               "(routing.binding_wall), 0 for the others",
                               labels=("pool", "wall"))
    for pool, wall in sorted(walls.items()):
        for name in WALLS:
            family.add_metric([pool, name], 1.0 if name == wall else 0.0)
    return family
