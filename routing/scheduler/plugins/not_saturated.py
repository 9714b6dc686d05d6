"""Filter ``not_saturated``: keeps the endpoints whose engine still has batch room.

Algorithm: keep ``ep`` when the engine's waiting queue (``vllm:num_requests_waiting`` /
``sglang:num_queue_reqs``, normalised as ``EngineMetrics.waiting``; unknown counts 0) is at
most ``max_waiting`` requests. A request sent to an endpoint with a waiting queue waits for a
batch slot before its prefill starts. If every candidate is saturated the scheduler returns no
pick and the caller falls back to another pool.

Parameters: ``max_waiting`` [requests, ≥ 0], default 0 (an engine that queues anything is
full); set it on a named instance in the fleet file::

    routing:
      plugins: [{name: roomy, type: not_saturated, parameters: {max_waiting: 4}}]
      scheduler: {filters: [healthy, roomy]}
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.scheduler.framework import SchedulingContext
from routing.snapshots import EndpointSnapshot


class NotSaturated:
    def __init__(self, max_waiting: object = 0.0) -> None:
        # object, not float: checked here, where the module is compiled too (mypyc's own check
        # of a float parameter takes True for 1.0)
        if isinstance(max_waiting, bool) or not isinstance(max_waiting, int | float) \
                or not max_waiting >= 0:
            raise ValueError(f"max_waiting must be a number >= 0, got {max_waiting!r}")
        self.max_waiting = float(max_waiting)

    def filter(self, ctx: SchedulingContext,
               candidates: Sequence[EndpointSnapshot]) -> Sequence[EndpointSnapshot]:
        return [ep for ep in candidates if (ep.metrics.waiting or 0.0) <= self.max_waiting]
