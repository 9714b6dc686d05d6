"""Scorer ``prefix_match``: the longer the cached prefix an endpoint holds, the higher its score.

Algorithm: score_e = matched_e / total, where matched_e [blocks] is the number of leading
prompt blocks the prefix index says endpoint e holds (``StateView.matched_blocks``, capped at
the prompt's block count) and total is the request's block count. A request with no complete
block (total = 0) scores 0 everywhere. Load is ignored: combine it with ``least_load`` or use
``cache_aware``. Parameters: none.
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.cache_cost import matched_blocks
from routing.scheduler.framework import SchedulingContext
from routing.snapshots import EndpointSnapshot


class PrefixMatch:
    def score(self, ctx: SchedulingContext,
              candidates: Sequence[EndpointSnapshot]) -> list[float]:
        total = len(ctx.features.block_hashes)
        if total == 0:
            return [0.0] * len(candidates)
        return [matched_blocks(ep.url, ctx.features, ctx.view) / total for ep in candidates]
