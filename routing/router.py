"""The optimization router: lever policy first, then the chosen pool's replica scheduler.

:meth:`Router.choose` is a pure function of the request's features, every pool's snapshot and
the router state's view: the :class:`~routing.policy.LeverPolicy` picks a pool (or a
prefill/decode pair), the pool's :class:`~routing.scheduler.framework.Scheduler` the replica
(each side of a pair on the same view). A pool whose filters leave no candidate is set aside
and the policy decides again over the rest. The endpoints of the pool lacking the decision's
lever (``PoolSnapshot.lacking``) are left out as if already tried; for a LoRA adapter the
replica choice runs over the adapter's tiers of endpoints, loaded first
(:func:`routing.scheduler.plugins.adapter_affinity.adapter_tiers`).

The router state runs ``choose`` inside :meth:`routing.state.protocol.RouterState.place`, which
reserves the chosen endpoints atomically: the only routing path. Parameters: ``policy``;
``schedulers``, one per pool name. Stateless apart from the plugins' own documented state.

See docs/routing.md#the-router.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from routing.decision import RouteDecision
from routing.features import RequestFeatures
from routing.native_value import NativeValue
from routing.policy import LeverPolicy, PolicyInput
from routing.scheduler.framework import PluginTiming, Scheduler, SchedulingContext
from routing.scheduler.plugins.adapter_affinity import adapter_tiers
from routing.snapshots import EndpointSnapshot, PoolSnapshot
from routing.state.protocol import StateView


class RoutePlan(NativeValue):
    """Where a request goes: ``endpoint`` answers it; ``prefill``, for a pair, computes its
    prompt first. ``timings``: every scheduler plugin that ran, in order."""

    FIELDS = ("decision", "endpoint", "prefill", "timings")
    __slots__ = FIELDS

    def __init__(self, decision: RouteDecision, endpoint: EndpointSnapshot,
                 prefill: EndpointSnapshot | None = None,
                 timings: tuple[PluginTiming, ...] = ()) -> None:
        self.decision: Final = decision
        self.endpoint: Final = endpoint
        self.prefill: Final = prefill
        self.timings: Final = timings

    @property
    def urls(self) -> tuple[str, ...]:
        """The endpoints the plan holds: the prefill side first, then the answering one."""
        if self.prefill is None:
            return (self.endpoint.url,)
        return (self.prefill.url, self.endpoint.url)

    @property
    def first(self) -> EndpointSnapshot:
        """The endpoint that computes the prompt (the prefill side of a pair)."""
        return self.prefill or self.endpoint


class Router:
    """Pools → lever → replica, for one fleet."""

    def __init__(self, policy: LeverPolicy, schedulers: Mapping[str, Scheduler]) -> None:
        self._policy = policy
        self._schedulers = dict(schedulers)

    @property
    def schedulers(self) -> Mapping[str, Scheduler]:
        return self._schedulers

    def choose(
        self,
        features: RequestFeatures,
        pools: tuple[PoolSnapshot, ...],
        view: StateView,
        exclude: frozenset[str] = frozenset(),
    ) -> RoutePlan | None:
        """A plan, or None when no pool can take the request (docs/routing.md#the-router)."""
        remaining = pools
        for _ in range(len(pools)):
            decision = self._policy.decide(PolicyInput(features, remaining, view))
            if decision is None:
                return None
            plan = self._place(decision, features, remaining, view, exclude)
            if plan is not None:
                return plan
            dropped = {decision.pool, decision.decode_pool}
            remaining = tuple(p for p in remaining if p.name not in dropped)
        return None

    def _place(self, decision: RouteDecision, features: RequestFeatures,
               pools: tuple[PoolSnapshot, ...], view: StateView,
               exclude: frozenset[str]) -> RoutePlan | None:
        lever = decision.lever
        first, timings = self._pick(_named(pools, decision.pool), lever, features, view,
                                    exclude)
        if first is None:
            return None
        if decision.decode_pool is None:
            return RoutePlan(decision, first, None, timings)
        decode, more = self._pick(_named(pools, decision.decode_pool), lever, features, view,
                                  exclude)
        if decode is None:
            return None
        return RoutePlan(decision, decode, first, timings + more)

    def _pick(self, pool: PoolSnapshot, lever: str, features: RequestFeatures,
              view: StateView, exclude: frozenset[str]) -> Picked:
        lacking = pool.lacking.get(lever) if pool.lacking else None
        if lacking:
            exclude = exclude | lacking
        tiers = adapter_tiers(pool, features.model) if pool.adapter_names else None
        if tiers is None:
            return self._schedule(pool, features, view, exclude)
        everyone = frozenset(ep.url for ep in pool.endpoints)
        timings: tuple[PluginTiming, ...] = ()
        for tier in tiers:
            chosen, ran = self._schedule(pool, features, view, exclude | (everyone - tier))
            timings += ran
            if chosen is not None:
                return chosen, timings
        return None, timings

    def _schedule(self, pool: PoolSnapshot, features: RequestFeatures, view: StateView,
                  exclude: frozenset[str]) -> Picked:
        return self._schedulers[pool.name].run(SchedulingContext(features, pool, view, exclude))


Picked = tuple[EndpointSnapshot | None, tuple[PluginTiming, ...]]
"""A pool's replica (None: none could take the request) and the plugins that ran for it."""


def _named(pools: tuple[PoolSnapshot, ...], name: str) -> PoolSnapshot:
    """The pool called ``name`` (KeyError when none is): a scan, as fleets hold few pools."""
    for pool in pools:
        if pool.name == name:
            return pool
    raise KeyError(name)
