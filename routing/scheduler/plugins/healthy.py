"""Filter ``healthy``: keeps the endpoints whose last health probe passed.

Algorithm: keep ``ep`` when ``ep.healthy``; order unchanged. Over the whole pool (no endpoint
set aside before it) that is the pool's ``healthy_endpoints``, computed with its snapshot.
Parameters: none.
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.scheduler.framework import SchedulingContext
from routing.snapshots import EndpointSnapshot


class Healthy:
    def filter(self, ctx: SchedulingContext,
               candidates: Sequence[EndpointSnapshot]) -> Sequence[EndpointSnapshot]:
        if candidates is ctx.pool.endpoints:
            return ctx.pool.healthy_endpoints
        return [ep for ep in candidates if ep.healthy]
