"""Picker ``max_score``: the endpoint with the highest weighted total score.

Algorithm: among the candidates whose total equals the maximum (up to float rounding, see
:func:`routing.scheduler.framework.top`), the first in candidate order — the pool's endpoint
order as configured — so the choice is deterministic. Parameters: none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from routing.scheduler.framework import SchedulingContext, top
from routing.snapshots import EndpointSnapshot


class MaxScore:
    def pick(self, ctx: SchedulingContext, candidates: Sequence[EndpointSnapshot],
             totals: Mapping[str, float]) -> EndpointSnapshot:
        return top(candidates, totals)[0]
