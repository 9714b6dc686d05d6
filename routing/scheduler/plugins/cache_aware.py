"""Scorer ``cache_aware`` (the default): fewest uncached prompt tokens × (load ÷ s + 1).

After the multiplicative score of LMetric (Zhang et al., arXiv 2603.15202); for each candidate
endpoint e (:func:`routing.cache_cost.cache_costs`):

    uncached_e [tokens]   = max(prompt_tokens − matched_e × block_tokens + reload_e, 1)
    load_e     [requests] = max(router in-flight, engine running + waiting)
    cost_e     [tokens × requests] = uncached_e × (load_e ÷ load_scale + 1)
    score_e    = min over candidates of cost / cost_e          (in (0, 1]; cheapest = 1)

reload_e prices the part of the match held only in a host KV tier (0 without KV events). A long
cached prefix wins unless its endpoint is much busier; with no cache anywhere it is least load.
Parameters: ``load_scale`` (requests on an endpoint that count as one queued ahead of the new
one, > 0; None = :data:`routing.cache_cost.LOAD_SCALE`: a literal default keeps the compiled
constructor's signature readable). Block size and prompt length come from the features.

See docs/routing.md#cache_aware.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from routing.cache_cost import LOAD_SCALE, cache_cost, cache_costs
from routing.scheduler.framework import SchedulingContext
from routing.snapshots import EndpointSnapshot


def cost(ctx: SchedulingContext, ep: EndpointSnapshot) -> float:
    """uncached_e × (load_e ÷ load_scale + 1) [tokens × requests], ≥ 1
    (:func:`routing.cache_cost.cache_cost`)."""
    return cache_cost(ep, ctx.features, ctx.view)


class CacheAware:
    def __init__(self, load_scale: float | None = None) -> None:
        load_scale = LOAD_SCALE if load_scale is None else load_scale
        if not (math.isfinite(load_scale) and load_scale > 0.0):
            raise ValueError("load_scale must be a positive number of requests")
        self.load_scale = load_scale

    def score(self, ctx: SchedulingContext,
              candidates: Sequence[EndpointSnapshot]) -> list[float]:
        costs = cache_costs(candidates, ctx.features, ctx.view, self.load_scale)
        if not costs:
            return costs
        cheapest = min(costs)
        return [cheapest / c for c in costs]
