"""Picker ``round_robin``: rotates over the endpoints with the highest total score.

Algorithm: among the candidates whose total equals the maximum (up to float rounding), take
the first URL, in sorted order, after the URL this picker chose last; wrap around to the
smallest. Rotating by URL rather than by a counter modulo the candidate count keeps the
rotation fair while endpoints come and go (an unhealthy one drops out of the candidates). With
no scorers every candidate ties and this is plain round-robin; with scorers it only breaks
ties.

State: the last URL chosen, held by this plugin instance. Each scheduler (one per pool, per
gateway process) builds its own instance, so rotations neither leak across pools nor live in
module state; gateway replicas rotate independently. Parameters: none.
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.scheduler.framework import SchedulingContext, top
from routing.snapshots import EndpointSnapshot


class RoundRobin:
    def __init__(self) -> None:
        self._last: str | None = None

    def pick(self, ctx: SchedulingContext, candidates: Sequence[EndpointSnapshot],
             totals: list[float]) -> EndpointSnapshot:
        tied = sorted(top(candidates, totals), key=lambda ep: ep.url)
        after = [ep for ep in tied if self._last is not None and ep.url > self._last]
        chosen = after[0] if after else tied[0]
        self._last = chosen.url
        return chosen
