"""Scorer ``session_affinity``: keeps a client session on the endpoint it last used.

Algorithm: score 1 for the endpoint the router's state says the request's session last used
(``StateView.session_endpoint``), 0 for every other; all 0 when the request has no session or
the session is new. Weighted against the other scorers it is a preference, not a pin: a
heavily loaded session endpoint can still lose. Parameters: none.
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.scheduler.framework import SchedulingContext
from routing.snapshots import EndpointSnapshot


class SessionAffinity:
    def score(self, ctx: SchedulingContext,
              candidates: Sequence[EndpointSnapshot]) -> list[float]:
        target = ctx.view.session_endpoint if ctx.features.session is not None else None
        return [1.0 if ep.url == target else 0.0 for ep in candidates]
