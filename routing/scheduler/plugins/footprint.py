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

from collections.abc import Mapping, Sequence

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
              candidates: Sequence[EndpointSnapshot]) -> Mapping[str, float]:
        if not candidates:
            return {}
        view = ctx.view
        footprint = view.recent_requests if self.by == "requests" else view.footprint
        if footprint is None or (best_match(candidates, ctx.features, view)
                                 >= self.threshold * len(ctx.features.block_hashes)):
            return dict.fromkeys([ep.url for ep in candidates], 1.0)
        loads = endpoint_loads(candidates, view.load)
        ceiling = min(loads.values()) + self.slack
        sizes = {url: footprint(url) for url, load in loads.items() if load <= ceiling}
        least = min(sizes.values())
        spread = max(sizes.values()) - least
        get = sizes.get
        for url in loads:  # the scores in place of the loads: the dict is this call's own
            size = get(url)
            if size is None:
                loads[url] = 0.0
            elif spread:
                loads[url] = 1.0 - (size - least) / spread
            else:
                loads[url] = 1.0
        return loads

