"""Counters and histograms for the request path: prometheus_client's, without a lock per value.

:class:`LeanCounter` and :class:`LeanHistogram` are prometheus_client's ``Counter`` and
``Histogram`` with only their per-series storage replaced (``_metric_init``,
``_child_samples``): a native :class:`Tally` or :class:`Buckets` (plain numbers, a
histogram's bucket found by a compiled binary search), which the request path updates with
direct calls. Names, labels, registration and the exposition are unchanged; exemplars and the
``time()`` / ``count_exceptions()`` helpers are gone.

Invariant: no lock is needed because ridge updates its metrics and renders ``/metrics`` only on
its event loop's thread (:mod:`gateway.services`); code that updates a metric from another
thread must keep prometheus_client's own classes. A bucket holds the values ≤ its bound; a NaN
lands in the first bucket. See docs/telemetry.md#lean-counters-and-histograms; what they save
is measured in docs/benchmarks/overhead.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from prometheus_client import Counter, Histogram
from prometheus_client import metrics as _metrics  # internals: test_lean_metrics_pins.py
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from gateway.telemetry.sorted_floats import bisect_left


def _le(bound: float) -> str:
    """A bucket's ``le`` label value, as prometheus_client writes it (``+Inf``, ``0.005``)."""
    return str(floatToGoString(bound))  # type: ignore[no-untyped-call]  # untyped upstream


def _created_on() -> bool:
    """prometheus_client's own switch for the ``_created`` series (its environment variable,
    or ``disable_created_metrics()``)."""
    return bool(getattr(_metrics, "_use_created", True))


class Tally:
    """One counter series' value [its unit], kept natively: the request path adds to it with a
    direct call (:meth:`Telemetry.record <gateway.telemetry.prometheus.Telemetry.record>`)."""

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()  # [s since the epoch]

    def add(self, amount: float) -> None:
        """Add ``amount`` (≥ 0; a ValueError otherwise, as prometheus_client's)."""
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount


class Buckets:
    """One histogram series' bucket counts and sum, kept natively; ``bounds``: the buckets'
    upper bounds, ascending, the last +Inf."""

    def __init__(self, bounds: list[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.total = 0.0
        self.created = time.time()  # [s since the epoch]

    def observe(self, amount: float) -> None:
        """Count ``amount`` in the first bucket whose bound is ≥ it (the last is +Inf)."""
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.total += amount

    def observe_all(self, amounts: Iterable[float]) -> None:
        """:meth:`observe` each of ``amounts`` (one call for a stream's inter-token gaps)."""
        counts, bounds = self.counts, self.bounds
        total = self.total
        for amount in amounts:
            counts[bisect_left(bounds, amount)] += 1
            total += amount
        self.total = total


class LeanCounter(Counter):
    """A :class:`prometheus_client.Counter` whose series keep a :class:`Tally` (module
    docstring)."""

    def _metric_init(self) -> None:
        self.tally = Tally()

    def inc(self, amount: float = 1, exemplar: dict[str, str] | None = None) -> None:
        """Add ``amount`` (≥ 0; a ValueError otherwise, as prometheus_client's)."""
        self.tally.add(amount)

    def _child_samples(self) -> Iterable[Sample]:
        tally = self.tally
        total = Sample("_total", {}, tally.value, None, None)
        if _created_on():
            return total, Sample("_created", {}, tally.created, None, None)
        return (total,)


class LeanHistogram(Histogram):
    """A :class:`prometheus_client.Histogram` whose series keep :class:`Buckets` (module
    docstring)."""

    def _metric_init(self) -> None:
        self._le = tuple(_le(bound) for bound in self._upper_bounds)
        self.buckets = Buckets(list(self._upper_bounds))

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        """Count ``amount`` in the first bucket whose bound is ≥ it (the last is +Inf)."""
        self.buckets.observe(amount)

    def observe_all(self, amounts: Iterable[float]) -> None:
        """:meth:`observe` each of ``amounts`` (one call for a stream's inter-token gaps)."""
        self.buckets.observe_all(amounts)

    def _child_samples(self) -> Iterable[Sample]:
        buckets = self.buckets
        samples, cumulative = [], 0
        for le, count in zip(self._le, buckets.counts, strict=True):
            cumulative += count
            samples.append(Sample("_bucket", {"le": le}, cumulative, None, None))
        samples.append(Sample("_count", {}, cumulative, None, None))
        if buckets.bounds[0] >= 0:
            samples.append(Sample("_sum", {}, buckets.total, None, None))
        if _created_on():
            samples.append(Sample("_created", {}, buckets.created, None, None))
        return tuple(samples)
