"""The replica scheduler inside one pool: filters → scorers → one picker.

Interfaces apart from plugins (one plugin per module under :mod:`routing.scheduler.plugins`),
all synchronous and pure over frozen snapshots: :class:`Filter` (candidates → the subset that
may take the request), :class:`Scorer` (candidates → a score per candidate, in their order,
meant to lie in [0, 1], 1 = best), :class:`Picker` (weighted totals → one endpoint).
:class:`Scheduler` runs them over a :class:`SchedulingContext`. Scores and totals are lists in
the candidates' order, not maps by URL: they are made and read for every candidate of every
request, and a list costs no hashing.

Invariants: the framework, not the plugin, clamps every score to [0, 1] (NaN counts 0) and
weights it: an endpoint's total is Σ weight × clamp(score); a scorer that does not score every
candidate is a ValueError. Plugin calls are timed [ns] on a regular sample of the calls. No
candidate left: the pick is None and the caller falls back. A plugin's state (a picker's
memory) lives on its instance, one per scheduler, never at module level. Configuration
(:class:`SchedulerConfig`) names plugin instances (:class:`PluginSpec`) or plugin types;
timings are reported under the instance name.

See docs/routing.md#the-scheduler-and-its-plugins.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from routing.features import RequestFeatures
from routing.native_value import NativeValue
from routing.snapshots import EndpointSnapshot, PoolSnapshot
from routing.state.protocol import StateView

FILTER = "filter"
SCORER = "scorer"
PICKER = "picker"


class SchedulingContext(NativeValue):
    """One request's scheduling inputs. ``exclude``: endpoint URLs already tried for this
    request (a retry goes elsewhere)."""

    FIELDS = ("features", "pool", "view", "exclude")
    __slots__ = FIELDS

    def __init__(self, features: RequestFeatures, pool: PoolSnapshot, view: StateView,
                 exclude: frozenset[str] = frozenset()) -> None:
        self.features: Final = features
        self.pool: Final = pool
        self.view: Final = view
        self.exclude: Final = exclude


class Filter(Protocol):
    def filter(self, ctx: SchedulingContext,
               candidates: Sequence[EndpointSnapshot]) -> Sequence[EndpointSnapshot]:
        """The candidates that may take the request, in their given order."""
        ...


class Scorer(Protocol):
    def score(self, ctx: SchedulingContext,
              candidates: Sequence[EndpointSnapshot]) -> list[float]:
        """A score in [0, 1] per candidate, in their order (1 = best); must accept an empty
        list."""
        ...


class Picker(Protocol):
    def pick(self, ctx: SchedulingContext, candidates: Sequence[EndpointSnapshot],
             totals: list[float]) -> EndpointSnapshot:
        """One of ``candidates`` (never empty, in pool order), given each one's weighted total
        score, in the same order (Σ weight × score, each score in [0, 1])."""
        ...


@dataclass(frozen=True, slots=True)
class PluginSpec:
    """A named plugin instance: ``name`` (what filters, scorers and picker refer to),
    ``type`` (a plugin of the catalog) and ``parameters`` (its keyword arguments)."""

    name: str
    type: str
    parameters: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Which plugins, by instance name. ``scorers``: (name, weight) pairs, weight > 0.
    ``seed``: for pickers that draw random numbers (unless their parameters set one).
    ``plugins``: the declared instances; a name not declared is a plugin type of the catalog
    with its default parameters."""

    filters: tuple[str, ...] = ("healthy",)
    scorers: tuple[tuple[str, float], ...] = (("cache_aware", 1.0), ("footprint", 3.0))
    picker: str = "max_score"
    seed: int = 0
    plugins: tuple[PluginSpec, ...] = ()


class PluginTiming(NativeValue):
    """How long one plugin call took [nanoseconds]. ``stage``: filter, scorer or picker."""

    FIELDS = ("stage", "name", "ns")
    __slots__ = FIELDS

    def __init__(self, stage: str, name: str, ns: int) -> None:
        self.stage: Final = stage
        self.name: Final = name
        self.ns: Final = ns


@dataclass(frozen=True, slots=True)
class ScheduleResult:
    """The pick (None when the filters left no candidate), every candidate's weighted total
    score by URL, and the timing of every plugin that ran, in run order."""

    endpoint: EndpointSnapshot | None
    scores: Mapping[str, float] = field(default_factory=dict)
    timings: tuple[PluginTiming, ...] = ()


Run = tuple[EndpointSnapshot | None, tuple[PluginTiming, ...]]
"""What the router needs of a :class:`ScheduleResult`: the pick and the timings."""

Decision = tuple[EndpointSnapshot | None, Sequence[EndpointSnapshot], list[float],
                 tuple[PluginTiming, ...]]
"""One run's pick, the candidates the filters left, their totals (in that order), timings."""


def clamp(score: float) -> float:
    """``score`` clamped to [0, 1]; NaN counts 0."""
    if math.isnan(score):
        return 0.0
    return min(max(score, 0.0), 1.0)


def top(candidates: Sequence[EndpointSnapshot], totals: list[float],
        rel_tol: float = 1e-9) -> list[EndpointSnapshot]:
    """The candidates (in their order) whose total (``totals``, in the same order) equals the
    maximum, up to float rounding: within ``rel_tol`` of it, as :func:`math.isclose` with an
    absolute floor of 1e-12."""
    if not candidates:
        return []
    best = max(totals)
    margin = rel_tol * abs(best)
    floor = best - (1e-12 if margin < 1e-12 else margin)  # max(margin, 1e-12), inline
    return [candidates[i] for i, total in enumerate(totals) if total >= floor]


class Scheduler:
    """Filters → weighted scorers → picker over one pool's endpoints; every plugin timed on
    one call in ``time_every`` (the first, then every ``time_every``-th: the timings are a
    regular sample, which keeps the clock and the histograms off most requests).

    Build it with :func:`routing.scheduler.catalog.build_scheduler`; ``clock`` is injectable
    so tests can check the timings (default :func:`time.perf_counter_ns`).
    """

    def __init__(
        self,
        filters: Sequence[tuple[str, Filter]],
        scorers: Sequence[tuple[str, Scorer, float]],
        picker: tuple[str, Picker],
        clock: Callable[[], int] = time.perf_counter_ns,
        time_every: int = 16,
    ) -> None:
        self._filters = tuple(filters)
        self._scorers = tuple(scorers)
        self._picker = picker
        self._clock = clock
        self._every = max(1, time_every)
        self._calls = 0

    @property
    def plugin_names(self) -> tuple[str, ...]:
        """Every plugin instance's name, in run order (the values of the timing label)."""
        return (*(n for n, _ in self._filters), *(n for n, _, _ in self._scorers),
                self._picker[0])

    def schedule(self, ctx: SchedulingContext) -> ScheduleResult:
        chosen, candidates, totals, timings = self.decide(ctx)
        return ScheduleResult(chosen, {ep.url: total for ep, total in
                                       zip(candidates, totals, strict=True)}, timings)

    def run(self, ctx: SchedulingContext) -> Run:
        """:meth:`schedule`'s pick and timings (the router's call: it needs neither a result
        object nor the totals)."""
        chosen, _, _, timings = self.decide(ctx)
        return chosen, timings

    def decide(self, ctx: SchedulingContext) -> Decision:
        """One run of the plugins: the pick, the candidates, their totals and the timings."""
        calls = self._calls
        self._calls = calls + 1
        if calls % self._every == 0:
            return self._timed(ctx)
        candidates: Sequence[EndpointSnapshot] = ctx.pool.endpoints
        if ctx.exclude:
            candidates = tuple(ep for ep in candidates if ep.url not in ctx.exclude)
        for _, plugin in self._filters:
            if not candidates:
                break
            candidates = plugin.filter(ctx, candidates)
        if not candidates:
            return None, candidates, [], ()
        totals = self._score(ctx, candidates, None)
        return self._picker[1].pick(ctx, candidates, totals), candidates, totals, ()

    def _timed(self, ctx: SchedulingContext) -> Decision:
        """:meth:`decide` with every plugin call timed."""
        timings: list[PluginTiming] = []
        candidates = self._filter(ctx, timings)
        if not candidates:
            return None, candidates, [], tuple(timings)
        totals = self._score(ctx, candidates, timings)
        name, picker = self._picker
        start = self._clock()
        chosen = picker.pick(ctx, candidates, totals)
        timings.append(PluginTiming(PICKER, name, self._clock() - start))
        return chosen, candidates, totals, tuple(timings)

    def _filter(self, ctx: SchedulingContext,
                timings: list[PluginTiming]) -> Sequence[EndpointSnapshot]:
        candidates: Sequence[EndpointSnapshot] = ctx.pool.endpoints
        if ctx.exclude:
            candidates = tuple(ep for ep in candidates if ep.url not in ctx.exclude)
        clock = self._clock
        for name, plugin in self._filters:
            if not candidates:
                break
            start = clock()
            candidates = plugin.filter(ctx, candidates)
            timings.append(PluginTiming(FILTER, name, clock() - start))
        return candidates

    def _score(self, ctx: SchedulingContext, candidates: Sequence[EndpointSnapshot],
               timings: list[PluginTiming] | None) -> list[float]:
        """Each candidate's Σ weight × clamp(score), in their order, every scorer timed when
        ``timings`` is given. The first scorer's weighted scores make the totals in one pass,
        every later one's are added in place; without scorers every total is 0."""
        totals: list[float] | None = None
        clock = self._clock
        for name, plugin, weight in self._scorers:
            start = clock() if timings is not None else 0
            scores = plugin.score(ctx, candidates)
            if timings is not None:
                timings.append(PluginTiming(SCORER, name, clock() - start))
            if len(scores) != len(candidates):
                raise ValueError(f"scorer {name!r} gave {len(scores)} scores for "
                                 f"{len(candidates)} candidates")
            # weight × clamp(score), NaN as 0 (as :func:`clamp`, inline: once per candidate)
            if totals is None:
                totals = [weight * (s if 0.0 <= s <= 1.0 else 1.0 if s > 1.0 else 0.0)
                          for s in scores]
                continue
            for i, s in enumerate(scores):
                totals[i] += weight * (s if 0.0 <= s <= 1.0 else 1.0 if s > 1.0 else 0.0)
        return totals if totals is not None else [0.0] * len(candidates)
