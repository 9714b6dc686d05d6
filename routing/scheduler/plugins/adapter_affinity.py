"""Filter ``adapter_affinity``: a request naming a LoRA adapter goes only to an endpoint that
has it, to one where it is already loaded first.

For the request's model ``m`` over the pool ``p`` (:func:`adapter_tiers`): a base model (one of
``p.models``) has one tier, every endpoint; an adapter up to two, best first — *loaded*, the
endpoints whose engine lists ``m`` (``ep.adapters``), and *loadable*, the others when the pool
declares ``m`` (``p.adapters``). Empty tiers are dropped; an adapter neither declared nor
listed leaves none. As a filter it keeps the candidates of the first tier that holds any; the
router applies the same tiers to every adapter request (:mod:`routing.router`), trying the next
tier only when one leaves no pick. A loaded copy wins over a lighter-loaded endpoint without
it (loading costs a disk read and an adapter slot); load balancing happens inside a tier.

Parameters: none.

See docs/routing.md#adapter_affinity.
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.scheduler.framework import SchedulingContext
from routing.snapshots import EndpointSnapshot, PoolSnapshot


def adapter_tiers(pool: PoolSnapshot, model: str) -> tuple[frozenset[str], ...] | None:
    """The endpoint URLs that may take ``model``, best tier first; None when ``model`` is a
    base model of ``pool`` (no restriction)."""
    if model in pool.models:
        return None
    loaded = frozenset(ep.url for ep in pool.endpoints if model in ep.adapters)
    loadable = (frozenset(ep.url for ep in pool.endpoints) - loaded
                if model in pool.adapters else frozenset())
    return tuple(tier for tier in (loaded, loadable) if tier)


class AdapterAffinity:
    def filter(self, ctx: SchedulingContext,
               candidates: Sequence[EndpointSnapshot]) -> Sequence[EndpointSnapshot]:
        tiers = adapter_tiers(ctx.pool, ctx.features.model)
        if tiers is None:
            return candidates
        for tier in tiers:
            kept = [ep for ep in candidates if ep.url in tier]
            if kept:
                return kept
        return []
