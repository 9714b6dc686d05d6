"""Picker ``max_score``: the endpoint with the highest weighted total score, ties spread by
request.

Algorithm: the candidates whose total equals the maximum (up to float rounding, see
:func:`routing.scheduler.framework.top`), in candidate order; when several tie, the one at
index (request digest mod number tied). The digest is the request's deepest prompt block hash
(it covers the whole prompt), else its session key, else 0. So the choice is deterministic —
the same request, in any gateway process, gets the same endpoint — yet requests that tie
(new conversations behind one cached system prompt, or an idle pool) spread evenly over the
tied endpoints instead of all going to the first one in the fleet file. Parameters: none.
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.features import RequestFeatures
from routing.scheduler.framework import SchedulingContext, top
from routing.snapshots import EndpointSnapshot


def request_digest(features: RequestFeatures) -> int:
    """The request's tie-breaking digest (module docstring)."""
    if features.block_hashes:
        return features.block_hashes[-1]
    return int(features.session, 16) if features.session else 0


class MaxScore:
    def pick(self, ctx: SchedulingContext, candidates: Sequence[EndpointSnapshot],
             totals: list[float]) -> EndpointSnapshot:
        tied = top(candidates, totals)
        if len(tied) == 1:
            return tied[0]
        return tied[request_digest(ctx.features) % len(tied)]
