"""Scorer ``footprint``: a request that brings little cached goes where the least is kept.

Algorithm: let n be the request's prompt blocks and m the longest match over the candidates
[blocks] (``StateView.matched_blocks``). A request with m ≥ ``threshold`` × n continues
something cached (a follow-up turn, a shared document): every candidate scores 1, and the
other scorers place it. Otherwise it starts something new whose KV will stay in the cache it
lands in, pushing out what is least recently used there; it scores, per candidate e,

    score_e = (F_min + 1) / (F_e + 1)        (in (0, 1]; the smallest footprint = 1)

where F_e [blocks] is the endpoint's footprint: the prompt blocks the prefix index recently
recorded there (``StateView.footprint``, :meth:`routing.prefix_index.PrefixIndex.footprint`),
a measure of the prefixes its cache keeps for requests yet to come back. New sessions so
spread by the cache they would evict rather than by the requests running now (which even out
in seconds, where a session's history waits for minutes) — the SGLang router's cache_aware
policy sends a request matching less than its ``cache_threshold`` to the worker with the
smallest radix tree for the same reason. Weighted beside ``cache_aware``, load still counts.
A state that keeps no footprint (``footprint`` None) scores 1 everywhere.

Parameters: ``threshold`` (fraction of the prompt's blocks, default 0.5: SGLang's
``cache_threshold`` default).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from routing.scheduler.framework import SchedulingContext
from routing.snapshots import EndpointSnapshot


class Footprint:
    def __init__(self, threshold: float = 0.5) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError("threshold must be in [0, 1]")
        self.threshold = threshold

    def score(self, ctx: SchedulingContext,
              candidates: Sequence[EndpointSnapshot]) -> Mapping[str, float]:
        footprint = ctx.view.footprint
        blocks = len(ctx.features.block_hashes)
        matched = ctx.view.matched_blocks
        longest = max((matched.get(ep.url, 0) for ep in candidates), default=0)
        if footprint is None or longest >= self.threshold * blocks:
            return {ep.url: 1.0 for ep in candidates}
        sizes = {ep.url: footprint(ep.url) for ep in candidates}
        least = min(sizes.values(), default=0)
        return {url: (least + 1) / (size + 1) for url, size in sizes.items()}
