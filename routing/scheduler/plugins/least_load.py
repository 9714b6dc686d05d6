"""Scorer ``least_load``: the fewer requests an endpoint holds, the higher its score.

Algorithm: load_e [requests] = the larger of the router state's in-flight count and the
engine's running + waiting (:func:`routing.load.endpoint_load`);
score_e = 1 − load_e / max_load, with max_load the largest load among the candidates, so the
busiest candidate scores 0 and an idle one 1. When every candidate is idle (max_load = 0) all
score 1. Parameters: none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from routing.load import endpoint_load
from routing.scheduler.framework import SchedulingContext
from routing.snapshots import EndpointSnapshot


class LeastLoad:
    def score(self, ctx: SchedulingContext,
              candidates: Sequence[EndpointSnapshot]) -> Mapping[str, float]:
        loads = {ep.url: endpoint_load(ep, ctx.view.load) for ep in candidates}
        max_load = max(loads.values(), default=0.0)
        if max_load <= 0:
            return {url: 1.0 for url in loads}
        return {url: 1.0 - load / max_load for url, load in loads.items()}
