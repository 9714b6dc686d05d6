"""Scorer ``footprint``: new work goes where the least recent work was sent, among the least
loaded.

Algorithm: let n be the request's prompt blocks and m the longest match over the candidates
[blocks] (:func:`routing.cache_cost.best_match`). A request with m ≥ ``threshold`` × n continues
something cached (a follow-up turn, a shared document): every candidate scores 1, and the
other scorers place it. Otherwise it starts something new (a session's first turn). Let L_e
[requests] be candidate e's load (:func:`routing.load.endpoint_load`, the ``cache_aware``
scorer's: the larger of the router's in-flight count and the engine's running + waiting) and
L_min the least. The eligible candidates are those with L_e ≤ L_min + ``slack``; with F_e the
candidate's footprint and F_min, F_max the least and most over the eligible,

    score_e = 1 − (F_e − F_min) / (F_max − F_min)   for e eligible (1 when all are equal)
    score_e = 0                                     otherwise          (in [0, 1])

F_e is, with ``by: requests`` (the default), the requests the prefix index recently recorded
on e (``StateView.recent_requests``, :meth:`routing.prefix_index.PrefixIndex.recent_requests`:
both generations of the index), or with ``by: blocks`` the prompt blocks its entries stand for
(``StateView.footprint``). Why: a session's replica is chosen at its first turn, and the
requests in flight even out within seconds while its later turns come back over minutes; a
replica serving long, active sessions has been sent more recently, so it draws fewer new
sessions and the requests per replica even out over the sessions' lifetimes. The SGLang
router's cache_aware policy sends a request matching less than its ``cache_threshold`` to the
worker with the smallest radix tree for the same reason, unless the workers' loads differ by
more than its ``balance_abs_threshold`` (32 requests); here that bound is ``slack``.

Weighted beside ``cache_aware`` (the default: 3 against its 1), the pair places new work on the
least recently used replica among the least loaded. A partial match below the threshold (a
shared system prompt) weighs only through ``cache_aware``. The eligible candidate with the
least footprint totals at least 3, an ineligible one at most 1, so new work always lands
within ``slack`` requests of the least loaded endpoint — a burst of new requests spreads
within ``slack`` of even whatever the footprints — and a follow-up keeps its cache whatever
the footprints. A state that keeps no footprint (None: the Redis state) scores 1 everywhere.

Parameters: ``threshold`` (fraction of the prompt's blocks, default 0.5: SGLang's
``cache_threshold`` default); ``slack`` (requests, default 2); ``by`` (``requests`` or
``blocks``, default ``requests``).
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

