"""The optimization router: lever policy first, then the chosen pool's replica scheduler.

Algorithm: the :class:`~routing.policy.LeverPolicy` picks a pool (or a prefill/decode pair)
from the request's features, every pool's snapshot and the router state's view; the pool's
own :class:`~routing.scheduler.framework.Scheduler` (filters → scorers → picker) picks the
replica; for a pair, each side's scheduler picks its replica. When a pool's filters leave no
candidate (every replica already tried, or none passes), that pool is set aside and the
policy decides again over the rest, so a request goes wherever the policy would send it next.
Parameters: ``policy``; ``schedulers``, one per pool name. Stateless apart from the plugins'
own documented state (round-robin's position).

:meth:`Router.place` stops one step short, for a router state that picks the replica and
reserves it atomically (:meth:`routing.state.RouterState.select_and_reserve`): it returns the
decision and, per side, the filtered candidates and the scorer weights, and the state does the
scoring and picking of :mod:`routing.select`. It is offered when every pool's scheduler can be
run that way (:attr:`Router.atomic`: picker ``max_score``, scorers among cache_aware,
least_load, prefix_match and session_affinity).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from routing.decision import RouteDecision
from routing.features import RequestFeatures
from routing.policy import LeverPolicy, PolicyInput
from routing.scheduler.framework import PluginTiming, Scheduler, SchedulingContext
from routing.state import StateView
from routing.types import EndpointSnapshot, PoolSnapshot

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class RoutePlan:
    """Where a request goes: ``endpoint`` answers it; ``prefill``, for a pair, computes its
    prompt first. ``timings``: every scheduler plugin that ran, in order."""

    decision: RouteDecision
    endpoint: EndpointSnapshot
    prefill: EndpointSnapshot | None = None
    timings: tuple[PluginTiming, ...] = ()


@dataclass(frozen=True, slots=True)
class Side:
    """One side of a placement: a pool, its candidates that passed the filters (in pool
    order, never empty) and its scheduler's scorer weights."""

    pool: PoolSnapshot
    candidates: tuple[EndpointSnapshot, ...]
    weights: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Placement:
    """The decision and its sides: one, or (prefill, decode) for a pair."""

    decision: RouteDecision
    sides: tuple[Side, ...]


class Router:
    """Pools → lever → replica, for one fleet."""

    def __init__(self, policy: LeverPolicy, schedulers: Mapping[str, Scheduler]) -> None:
        self._policy = policy
        self._schedulers = dict(schedulers)
        self._weights = {name: s.atomic_weights() for name, s in self._schedulers.items()}

    @property
    def atomic(self) -> bool:
        """Whether every pool's scheduler can be run atomically by the state."""
        return all(w is not None for w in self._weights.values())

    def place(
        self,
        features: RequestFeatures,
        pools: tuple[PoolSnapshot, ...],
        view: StateView,
        now: float,
        exclude: frozenset[str] = frozenset(),
    ) -> Placement | None:
        """The decision and each side's candidates (requires :attr:`atomic`), or None when
        no pool can take the request; pools are set aside as in :meth:`plan`."""
        def attempt(decision: RouteDecision, by_name: Mapping[str, PoolSnapshot]
                    ) -> Placement | None:
            names = [n for n in (decision.pool, decision.decode_pool) if n is not None]
            sides = [self._side(by_name[n], features, view, now, exclude) for n in names]
            return Placement(decision, tuple(sides)) if all(s.candidates for s in sides) else None
        return self._first(features, pools, view, attempt)

    def _first(self, features: RequestFeatures, pools: tuple[PoolSnapshot, ...],
               view: StateView, attempt: Callable[[RouteDecision, Mapping[str, PoolSnapshot]],
                                                  _T | None]) -> _T | None:
        """The policy decides; ``attempt`` tries the decision; when it fails, the decision's
        pool(s) are set aside and the policy decides again over the rest."""
        remaining = pools
        for _ in range(len(pools)):
            decision = self._policy.decide(PolicyInput(features, remaining, view))
            if decision is None:
                return None
            outcome = attempt(decision, {p.name: p for p in remaining})
            if outcome is not None:
                return outcome
            dropped = {decision.pool, decision.decode_pool}
            remaining = tuple(p for p in remaining if p.name not in dropped)
        return None

    def _side(self, pool: PoolSnapshot, features: RequestFeatures, view: StateView, now: float,
              exclude: frozenset[str]) -> Side:
        ctx = SchedulingContext(features, pool, view, now, exclude)
        weights = self._weights[pool.name]
        if weights is None:
            raise ValueError(f"pool {pool.name!r}: its scheduler cannot run atomically")
        return Side(pool, self._schedulers[pool.name].candidates(ctx), weights)

    def plan(
        self,
        features: RequestFeatures,
        pools: tuple[PoolSnapshot, ...],
        view: StateView,
        now: float,
        exclude: frozenset[str] = frozenset(),
    ) -> RoutePlan | None:
        """A plan, or None when no pool can take the request."""
        timings: list[PluginTiming] = []

        def attempt(decision: RouteDecision, by_name: Mapping[str, PoolSnapshot]
                    ) -> RoutePlan | None:
            return self._place(decision, features, by_name, view, now, exclude, timings)
        return self._first(features, pools, view, attempt)

    def _place(
        self,
        decision: RouteDecision,
        features: RequestFeatures,
        by_name: Mapping[str, PoolSnapshot],
        view: StateView,
        now: float,
        exclude: frozenset[str],
        timings: list[PluginTiming],
    ) -> RoutePlan | None:
        first = self._pick(by_name[decision.pool], features, view, now, exclude, timings)
        if first is None:
            return None
        if decision.decode_pool is None:
            return RoutePlan(decision, first, None, tuple(timings))
        decode = self._pick(by_name[decision.decode_pool], features, view, now, exclude, timings)
        if decode is None:
            return None
        return RoutePlan(decision, decode, first, tuple(timings))

    def _pick(
        self,
        pool: PoolSnapshot,
        features: RequestFeatures,
        view: StateView,
        now: float,
        exclude: frozenset[str],
        timings: list[PluginTiming],
    ) -> EndpointSnapshot | None:
        result = self._schedulers[pool.name].schedule(
            SchedulingContext(features, pool, view, now, exclude)
        )
        timings.extend(result.timings)
        return result.endpoint
