"""One ``/metrics`` page for all the workers of ``ridge serve --workers N``.

Each worker counts only the requests it served, so the worker that answers a scrape asks every
other worker for its own page (a Unix socket per worker, :func:`serve_own_page`), and merges
them with its own, sample by sample (same name and labels), by these rules (data, not code):

- counters, histograms (buckets, counts, sums): added up — except samples labelled
  ``source="engine"``: every worker read the same engine counters, so the largest is taken;
  ``*_created`` samples: the earliest;
- gauges of this worker's own requests (:data:`SUMMED_GAUGES`, and the MFU/MBU ratios of
  ridge's own accounting): added up;
- :data:`LOWEST_GAUGES` (a backend up in every worker?): the lowest;
- every other gauge (engine figures, the router's shared totals and windows, SLO bounds,
  hardware facts) is the same in every worker up to a poll: the largest.

A worker that does not answer within ``timeout_s`` is left out of that scrape (logged once per
scrape at debug level).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

log = logging.getLogger("ridge.workers")

SUMMED_GAUGES = frozenset({
    "ridge_requests_in_flight", "ridge_endpoint_requests_in_flight",
    "ridge_admission_queue_depth",
    "ridge_mfu_ratio", "ridge_mbu_ratio", "ridge_pool_mfu_ratio", "ridge_pool_mbu_ratio",
})
LOWEST_GAUGES = frozenset({"ridge_state_backend_up"})
ADDED_TYPES = frozenset({"counter", "histogram", "summary", "gaugehistogram"})

Key = tuple[str, tuple[tuple[str, str], ...]]
Merge = Callable[[float, float], float]


@dataclass
class _Family:
    name: str
    documentation: str
    type: str
    values: dict[Key, float] = field(default_factory=dict)


def rule(family: str, kind: str, sample: str, labels: Mapping[str, str]) -> Merge:
    """How two workers' values of one sample combine (module docstring)."""
    if sample.endswith("_created"):
        return min
    if labels.get("source") == "engine":
        return max
    if kind in ADDED_TYPES or family in SUMMED_GAUGES:
        return _add
    if family in LOWEST_GAUGES:
        return min
    return max


def _add(a: float, b: float) -> float:
    return a + b


def merge(pages: Sequence[str]) -> bytes:
    """The merged exposition of ``pages`` (Prometheus text format)."""
    families: dict[str, _Family] = {}
    for page in pages:
        for metric in text_string_to_metric_families(page):
            fam = families.setdefault(metric.name, _Family(metric.name, metric.documentation,
                                                           metric.type))
            for s in metric.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                old = fam.values.get(key)
                fam.values[key] = s.value if old is None else \
                    rule(fam.name, fam.type, s.name, s.labels)(old, s.value)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(list(families.values())))
    return generate_latest(registry)


class _Merged:
    def __init__(self, families: list[_Family]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        for fam in self._families:
            metric = Metric(fam.name, fam.documentation, fam.type)
            metric.samples = [Sample(name, dict(labels), value)
                              for (name, labels), value in fam.values.items()]
            yield metric


async def fetch_page(path: str, timeout_s: float) -> str | None:
    """A worker's own page from its Unix socket (None: it did not answer in time)."""
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_unix_connection(path)
            try:
                return (await reader.read()).decode()
            finally:
                writer.close()
    except (OSError, TimeoutError) as exc:
        log.debug("worker metrics at %s: %s", path, exc)
        return None


async def merged_page(own: bytes, peers: Sequence[str], timeout_s: float = 1.0) -> bytes:
    """This worker's page merged with every other worker's."""
    others = await asyncio.gather(*(fetch_page(p, timeout_s) for p in peers))
    return merge([own.decode(), *(page for page in others if page is not None)])


async def serve_own_page(path: str, page: Callable[[], bytes]) -> asyncio.AbstractServer:
    """Answer every connection on the Unix socket ``path`` with ``page()`` and close it."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(page())
            await writer.drain()
        finally:
            writer.close()

    return await asyncio.start_unix_server(answer, path)
