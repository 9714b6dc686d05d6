"""The optimization router: lever policy first, then the chosen pool's replica scheduler.

Algorithm (:meth:`Router.choose`, a pure function of the request's features, every pool's
snapshot and the router state's view): the :class:`~routing.policy.LeverPolicy` picks a pool
(or a prefill/decode pair); the pool's own :class:`~routing.scheduler.framework.Scheduler`
(filters → scorers → picker, the plugins) picks the replica; for a pair, each side's
scheduler picks its replica on the same view. When a pool's filters leave no candidate (every
replica already tried, or none passes), that pool is set aside and the policy decides again
over the rest, so a request goes wherever the policy would send it next.

Levers verified against the engines: when the decision sends the request to a pool for a lever
(``decision.lever``), the endpoints of that pool whose engine lacks the lever
(``PoolSnapshot.lacking``, from the registry's lever check) are left out of the replica choice,
as if already tried. The policy only picks a pool for a lever some healthy endpoint of it runs
(``PoolSnapshot.offered``), so the pool keeps a candidate unless its filters or the request's
exclusions remove it; then the pool is set aside as above. A decision without a lever
(``none``: default traffic, a model's only pool, the last resort) may use every endpoint. The
cost on the hot path is one test of an empty mapping when every engine runs what its pool
declares.

LoRA adapters: when the request's model is an adapter of the pool rather than one of its base
models, the replica choice runs over the adapter's tiers of endpoints
(:func:`routing.scheduler.plugins.adapter_affinity.adapter_tiers`: those that list it as loaded
first, then those that could load it), the endpoints outside the tier left out as if already
tried; the next tier is tried only when a tier leaves no pick, and none left sets the pool
aside as above. Every request for an adapter gets this, whatever the pool's configured plugins;
a pool without adapters pays one test of an empty set.

The router state runs ``choose`` inside :meth:`routing.state.protocol.RouterState.place`, which
reserves the chosen endpoints atomically: this is the only routing path, whichever state is
in use. Parameters: ``policy``; ``schedulers``, one per pool name. Stateless apart from the
plugins' own documented state (round-robin's position, random_top's generator).
"""

from __future__ import annotations

from collections.abc import Mapping

from routing.decision import RouteDecision
from routing.features import RequestFeatures
from routing.policy import LeverPolicy, PolicyInput
from routing.scheduler.framework import PluginTiming, Scheduler, SchedulingContext
from routing.scheduler.plugins.adapter_affinity import adapter_tiers
from routing.snapshots import EndpointSnapshot, PoolSnapshot
from routing.state.protocol import StateView
from routing.values import value


@value
class RoutePlan:
    """Where a request goes: ``endpoint`` answers it; ``prefill``, for a pair, computes its
    prompt first. ``timings``: every scheduler plugin that ran, in order."""

    decision: RouteDecision
    endpoint: EndpointSnapshot
    prefill: EndpointSnapshot | None = None
    timings: tuple[PluginTiming, ...] = ()

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
        """A plan, or None when no pool can take the request (see the module docstring)."""
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
        chosen, _, timings = self._schedulers[pool.name].run(
            SchedulingContext(features, pool, view, exclude))
        return chosen, timings


Picked = tuple[EndpointSnapshot | None, tuple[PluginTiming, ...]]
"""A pool's replica (None: none could take the request) and the plugins that ran for it."""


def _named(pools: tuple[PoolSnapshot, ...], name: str) -> PoolSnapshot:
    """The pool called ``name`` (KeyError when none is): a scan, as fleets hold few pools."""
    for pool in pools:
        if pool.name == name:
            return pool
    raise KeyError(name)
