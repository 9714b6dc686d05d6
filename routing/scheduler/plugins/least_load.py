"""Scorer ``least_load``: the fewer requests an endpoint holds, the higher its score.

Algorithm: load_e [requests] = the larger of the router state's in-flight count and the
engine's running + waiting (:func:`routing.load.endpoint_load`);
score_e = 1 − load_e / max_load, with max_load the largest load among the candidates, so the
busiest candidate scores 0 and an idle one 1. When every candidate is idle (max_load = 0) all
score 1. Parameters: none.
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.load import endpoint_loads
from routing.scheduler.framework import SchedulingContext
from routing.snapshots import EndpointSnapshot


class LeastLoad:
    def score(self, ctx: SchedulingContext,
              candidates: Sequence[EndpointSnapshot]) -> list[float]:
        loads = endpoint_loads(candidates, ctx.view.load)
        max_load = max(loads, default=0.0)
        if max_load <= 0:
            return [1.0] * len(loads)
        return [1.0 - load / max_load for load in loads]
