"""Filter ``healthy``: keeps the endpoints whose last health probe passed.

Algorithm: keep ``ep`` when ``ep.healthy``; order unchanged. Parameters: none.
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.scheduler.framework import SchedulingContext
from routing.snapshots import EndpointSnapshot


class Healthy:
    def filter(self, ctx: SchedulingContext,
               candidates: Sequence[EndpointSnapshot]) -> Sequence[EndpointSnapshot]:
        return [ep for ep in candidates if ep.healthy]
