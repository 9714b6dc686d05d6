"""Scorer ``footprint``: new work goes where the least recent work was sent, among the least
loaded.

A request whose longest match over the candidates is ≥ ``threshold`` × its prompt blocks
continues something cached: every candidate scores 1. Else, with L_e candidate e's load
[requests] (:func:`routing.load.endpoint_load`) and F_e its footprint (``by: requests``: the
requests the prefix index recently recorded on e; ``by: blocks``: the blocks its entries stand
for), the candidates with L_e ≤ L_min + ``slack`` are eligible, F_min and F_max over them:

    score_e = 1 − (F_e − F_min) / (F_max − F_min)   for e eligible (1 when all are equal)
    score_e = 0                                     otherwise          (in [0, 1])

A state keeping no footprint (None: Redis) scores 1 everywhere. Parameters: ``threshold``
(fraction of the prompt's blocks, default 0.5); ``slack`` (requests, default 2); ``by``
(``requests``, the default, or ``blocks``).

See docs/routing.md#footprint.
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.cache_cost import best_match
from routing.load import endpoint_loads
from routing.scheduler.framework import SchedulingContext
from routing.snapshots import EndpointSnapshot

MEASURES = ("requests", "blocks")


class Footprint:
    def __init__(self, threshold: float = 0.5, slack: float = 2.0, by: str = "requests") -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError("threshold must be in [0, 1]")
        if not slack >= 0.0:
            raise ValueError("slack must be ≥ 0 requests")
        if by not in MEASURES:
            raise ValueError(f"by must be one of {', '.join(MEASURES)}")
        self.threshold = threshold
        self.slack = slack
        self.by = by

    def score(self, ctx: SchedulingContext,
              candidates: Sequence[EndpointSnapshot]) -> list[float]:
        if not candidates:
            return []
        view = ctx.view
        footprint = view.recent_requests if self.by == "requests" else view.footprint
        if footprint is None or (best_match(candidates, ctx.features, view)
                                 >= self.threshold * len(ctx.features.block_hashes)):
            return [1.0] * len(candidates)
        loads = endpoint_loads(candidates, view.load)
        ceiling = min(loads) + self.slack
        sizes = [footprint(candidates[i].url) if load <= ceiling else -1  # -1: not eligible
                 for i, load in enumerate(loads)]
        eligible = [size for size in sizes if size >= 0]
        least = min(eligible)
        spread = max(eligible) - least
        return [0.0 if size < 0 else (1.0 - (size - least) / spread if spread else 1.0)
                for size in sizes]

