"""Counters and histograms for the request path: prometheus_client's, without a lock per value.

:class:`LeanCounter` and :class:`LeanHistogram` are prometheus_client's ``Counter`` and
``Histogram`` with only their per-series storage replaced (``_metric_init``,
``_child_samples``): plain numbers, and a histogram's bucket found by :func:`bisect.bisect_left`
rather than a Python loop. Names, labels, registration and the exposition are unchanged;
exemplars and the ``time()`` / ``count_exceptions()`` helpers are gone.

Invariant: no lock is needed because ridge updates its metrics and renders ``/metrics`` only on
its event loop's thread (:mod:`gateway.services`); code that updates a metric from another
thread must keep prometheus_client's own classes. A bucket holds the values ≤ its bound; a NaN
lands in the first bucket. See docs/telemetry.md#lean-counters-and-histograms; what they save
is measured in docs/benchmarks/overhead.md.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable

from prometheus_client import Counter, Histogram
from prometheus_client import metrics as _metrics  # internals: test_lean_metrics_pins.py
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString


def _le(bound: float) -> str:
    """A bucket's ``le`` label value, as prometheus_client writes it (``+Inf``, ``0.005``)."""
    return str(floatToGoString(bound))  # type: ignore[no-untyped-call]  # untyped upstream


def _created_on() -> bool:
    """prometheus_client's own switch for the ``_created`` series (its environment variable,
    or ``disable_created_metrics()``)."""
    return bool(getattr(_metrics, "_use_created", True))


class LeanCounter(Counter):
    """A :class:`prometheus_client.Counter` whose series keep a plain float (module docstring)."""

    def _metric_init(self) -> None:
        self._count = 0.0
        self._created = time.time()

    def inc(self, amount: float = 1, exemplar: dict[str, str] | None = None) -> None:
        """Add ``amount`` (≥ 0; a ValueError otherwise, as prometheus_client's)."""
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self._count += amount

    def _child_samples(self) -> Iterable[Sample]:
        total = Sample("_total", {}, self._count, None, None)
        if _created_on():
            return total, Sample("_created", {}, self._created, None, None)
        return (total,)


class LeanHistogram(Histogram):
    """A :class:`prometheus_client.Histogram` whose series keep a list of bucket counts and a
    float sum (module docstring)."""

    def _metric_init(self) -> None:
        self._le = tuple(_le(bound) for bound in self._upper_bounds)
        self._counts = [0] * len(self._upper_bounds)
        self._total = 0.0
        self._created = time.time()

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        """Count ``amount`` in the first bucket whose bound is ≥ it (the last is +Inf)."""
        self._counts[bisect_left(self._upper_bounds, amount)] += 1
        self._total += amount

    def observe_all(self, amounts: Iterable[float]) -> None:
        """:meth:`observe` each of ``amounts`` (one call for a stream's inter-token gaps)."""
        counts: list[int] = self._counts  # typed: list operations, not generic ones
        bounds: list[float] = self._upper_bounds
        total: float = self._total
        for amount in amounts:
            counts[bisect_left(bounds, amount)] += 1
            total += amount
        self._total = total

    def _child_samples(self) -> Iterable[Sample]:
        samples, cumulative = [], 0
        for le, count in zip(self._le, self._counts, strict=True):
            cumulative += count
            samples.append(Sample("_bucket", {"le": le}, cumulative, None, None))
        samples.append(Sample("_count", {}, cumulative, None, None))
        if self._upper_bounds[0] >= 0:
            samples.append(Sample("_sum", {}, self._total, None, None))
        if _created_on():
            samples.append(Sample("_created", {}, self._created, None, None))
        return tuple(samples)
