"""Filter ``adapter_affinity``: a request naming a LoRA adapter goes only to an endpoint that
has it, to one where it is already loaded first.

Algorithm, for the request's model ``m`` over the pool ``p`` (:func:`adapter_tiers`):

- ``m`` is one of ``p.models`` (a base model): no restriction (one tier, every endpoint);
- else ``m`` is an adapter, and the endpoints form two tiers, best first: *loaded*, the
  endpoints whose engine lists ``m`` (``ep.adapters``: its ``/v1/models`` cards with a
  ``parent``); *loadable*, the others, when the pool declares ``m`` (``p.adapters``: its
  engines were launched with it, or load it on demand), none otherwise. Empty tiers are
  dropped; an adapter neither declared nor listed anywhere leaves no tier.

As a filter (:meth:`AdapterAffinity.filter`) it keeps, of the candidates left by the filters
before it, those of the first tier that holds any. The router applies the same tiers to every
request, whatever the pool's configured plugins (:mod:`routing.router`): the scheduler runs
over the first tier, and over the next only when the first leaves no pick (every loaded
endpoint unhealthy, saturated or already tried). Loading an adapter costs the engine a
disk read and a slot among its active adapters (vLLM ``--max-loras``), so a loaded copy wins
over a lighter-loaded endpoint without it; load balancing happens inside a tier.

Parameters: none.
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
