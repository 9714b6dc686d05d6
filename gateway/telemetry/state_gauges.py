"""Gauges of the router state's memory: how full the prefix index is against its cap.

``ridge_prefix_index_capacity_entries``: the cap on the (block, endpoint) pairs the entries of
this process's state stand for, past a prompt's 16th block one entry for 4
(``RIDGE_STATE__MAX_PREFIX_ENTRIES``, else derived from the fleet's KV capacity);
``ridge_prefix_index_entries``: the entries this process holds now, and
``ridge_prefix_index_bytes``: their memory at :data:`routing.prefix_index.BYTES_PER_ENTRY`
each — for an in-memory state (a worker's replica included; a Redis state's shared index is
Redis's memory, not this process's: no series then).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from routing.prefix_index import BYTES_PER_ENTRY
from routing.state.memory import StateSizes


class StateGauges(Collector):
    """``cap``: the prefix index's cap [entries]; ``sizes``: the state's sizes now, or None
    when this process does not hold the index."""

    def __init__(self, cap: int, sizes: Callable[[], StateSizes] | None) -> None:
        self._cap, self._sizes = cap, sizes

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("ridge_prefix_index_capacity_entries", "the prefix index's cap "
                                "on the (block, endpoint) pairs its entries stand for",
                                value=float(self._cap))
        if self._sizes is None:
            return
        entries = float(self._sizes().prefix_entries)
        yield GaugeMetricFamily("ridge_prefix_index_entries", "(block, endpoint) entries the "
                                "prefix index of this process holds", value=entries)
        yield GaugeMetricFamily("ridge_prefix_index_bytes", "their memory [B], estimated at "
                                f"{BYTES_PER_ENTRY} B per entry", value=entries * BYTES_PER_ENTRY)
