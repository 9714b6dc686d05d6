"""Scorer ``cache_aware`` (the default): fewest uncached prompt tokens × (load ÷ s + 1).

Algorithm (after the multiplicative score of LMetric, Zhang et al., "Simple is Better —
Multiplication May Be All You Need for LLM Request Scheduling", arXiv 2603.15202): for each
candidate endpoint e,

    uncached_e [tokens]   = max(prompt_tokens − matched_e × block_tokens + reload_e, 1)
    load_e     [requests] = max(router in-flight, engine running + waiting)
    cost_e     [tokens × requests] = uncached_e × (load_e ÷ load_scale + 1)
    score_e    = min over candidates of cost / cost_e          (in (0, 1]; cheapest = 1)

matched_e is the number of leading prompt blocks the prefix index says e holds; reload_e
[tokens] prices the part of that match an engine reports holding only in its host KV tier (its
KV events): reloading a block costs a fraction of recomputing it
(``routing.formulas.host_reload_ratio``), so such a block is cheaper than none and dearer
than one on the device; 0 without events. The cost is the prefill work the request adds on e
scaled by the requests it shares e with: a long cached prefix wins unless its endpoint is much
busier, and with no cache anywhere it reduces to least load. The product needs no weight
between the two terms — any constant factor on either cancels in the ratio; one parameter,
the load's scale below, sets how soon load counts — unlike SGLang's cache_aware policy, which
switches between cache affinity and shortest queue at tuned thresholds (cache_threshold,
balance_abs_threshold, balance_rel_threshold).

The load's scale: LMetric counts every request on an endpoint as one queued ahead of the new
one (``load_scale`` 1); an engine batches what it runs, so they slow a new request more than
they hold it back. On the capacity benchmark's long sessions (``docs/benchmarks/capacity.md``,
KV large enough never to evict) ``load_scale`` 1 sent a follow-up whose 8,000-token history
sat on a replica running 12 requests to an idle replica, which recomputed it; with 2 no
follow-up left its history on either seed and the requests per replica stayed within 1.08 of
the mean; with 4 none left either, but the replicas drifted apart (1.18). Counting the
engine's waiting requests whole and only the others ÷ 2 kept the follow-ups too, and spread
the replicas to 1.14–1.15. With ``load_scale`` 1 the cost is LMetric's exactly.

Zero cost: uncached tokens are floored at 1 — an engine that holds the whole prompt still
computes the last prompt token to produce the first output token — so cost_e ≥ 1 and the ratio
is always defined, and two endpoints that both hold the whole prompt are still told apart by
load. The ``+ 1`` keeps an idle endpoint's cost equal to its prefill work rather than 0.

Parameters: ``load_scale`` (requests on an endpoint that count as one queued ahead of the new
one, > 0; default — also when None — :data:`routing.cache_cost.LOAD_SCALE`, 2: a literal
default, as None is, keeps the constructor's signature readable when the module is compiled).
Block size and prompt length come from the request's features.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

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
              candidates: Sequence[EndpointSnapshot]) -> Mapping[str, float]:
        costs = cache_costs(candidates, ctx.features, ctx.view, self.load_scale)
        if costs:
            cheapest = min(costs.values())
            for url, c in costs.items():
                costs[url] = cheapest / c  # in place: the costs are this call's own
        return costs
