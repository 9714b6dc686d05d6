"""The ``/metrics`` page of one process: its registry rendered in Prometheus' text format.

prometheus_client gives every counter and histogram a ``_created`` sample (when the series was
made, in Unix seconds). Nothing ridge ships reads them and they are a quarter of the page's
series, so :func:`page` leaves them out unless ``created`` (``RIDGE_METRICS_CREATED``).
Every other family and sample is rendered as the registry holds it. See
docs/telemetry.md#metrics.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric


class _WithoutCreated:
    """A registry's families, each without its ``NAME_created`` samples (new family objects:
    a collector's own are never changed)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            created = family.name + "_created"
            if not any(s.name == created for s in family.samples):
                yield family
                continue
            kept = Metric(family.name, family.documentation, family.type, family.unit)
            kept.samples = [s for s in family.samples if s.name != created]
            yield kept


def page(registry: CollectorRegistry, created: bool = False) -> bytes:
    """``registry`` in the text exposition format; its ``_created`` samples only if
    ``created``."""
    return generate_latest(registry if created else _WithoutCreated(registry))
