"""Pins of ``gateway/telemetry/lean_metrics.py``: ``LeanCounter`` and ``LeanHistogram`` replace
prometheus_client's private per-series storage. They rely on ``MetricWrapperBase`` calling
``_metric_init()`` for each series (an unlabelled metric, each child of ``labels()``, built as
``type(self)``) and exposing each series' ``_child_samples()``; on ``Histogram._upper_bounds``
(sorted floats ending in +Inf, set before ``_metric_init``); on the module global
``metrics._use_created`` (read with a default, so a rename would go unnoticed); on
``utils.floatToGoString`` and the field order of ``Sample``; and on ``inc``/``observe`` taking
``(amount, exemplar)``. These tests fail, naming prometheus_client's versions and the hook, when
an upgrade changed those internals."""

from __future__ import annotations

import math
from collections.abc import Iterable

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, samples, utils
from prometheus_client import metrics as prometheus_metrics

from gateway.telemetry.lean_metrics import LeanCounter, LeanHistogram
from tests.unit.library_pins import Hook

WRITTEN_AGAINST = "0.26.0"
"""The prometheus_client release LeanCounter and LeanHistogram were written against."""

HOOK = Hook("prometheus-client", WRITTEN_AGAINST,
            "LeanCounter / LeanHistogram (_metric_init, _child_samples, _created_on, _le) in "
            "gateway/telemetry/lean_metrics.py")

OWN_COUNTER = ("_count", "_created")
OWN_HISTOGRAM = ("_le", "_counts", "_total", "_created", "observe_all")
"""What the lean classes set on a series for their own use: none may be the library's."""


def test_the_installed_prometheus_client_is_the_minor_release_the_hook_was_checked_against(
) -> None:
    HOOK.check_version()
    HOOK.check_pin()


def test_the_private_methods_ridge_overrides() -> None:
    for cls, own in ((Counter, OWN_COUNTER), (Histogram, OWN_HISTOGRAM)):
        HOOK.method(cls, "_metric_init", [])
        HOOK.method(cls, "_child_samples", [])
        HOOK.no_clash(cls, own)
    HOOK.method(Counter, "inc", ["amount", "exemplar"])
    HOOK.method(Histogram, "observe", ["amount", "exemplar"])
    HOOK.check(issubclass(LeanCounter, Counter) and issubclass(LeanHistogram, Histogram),
               "the lean classes are not its Counter and Histogram")


class Probe(Counter):
    """Records the series ``_metric_init`` was called for; exposes one sample each."""

    inits: list[tuple[str, ...]] = []

    def _metric_init(self) -> None:
        Probe.inits.append(self._labelvalues)

    def _child_samples(self) -> Iterable[samples.Sample]:
        return (samples.Sample("_total", {"extra": "1"}, 7.0, None, None),)


def test_each_series_is_initialised_and_exposed_through_the_overridden_methods() -> None:
    Probe.inits.clear()
    registry = CollectorRegistry()
    plain = Probe("plain", "doc", registry=registry)
    HOOK.check(Probe.inits == [()], "an unlabelled metric's _metric_init was not called")
    labelled = Probe("labelled", "doc", ("a",), registry=registry)
    HOOK.check(Probe.inits == [()], "a labelled parent's _metric_init was called")
    child = labelled.labels("x")
    HOOK.check(type(child) is Probe, "labels() no longer builds its child as type(self)")
    HOOK.check(Probe.inits == [(), ("x",)], "a child's _metric_init was not called")
    exposed = {(s.name, tuple(sorted(s.labels.items())), s.value)
               for m in (plain, labelled) for f in m.collect() for s in f.samples}
    HOOK.check(exposed == {("plain_total", (("extra", "1"),), 7.0),
                           ("labelled_total", (("a", "x"), ("extra", "1")), 7.0)},
               f"collect() no longer exposes each series' _child_samples ({exposed})")


def test_histogram_bounds_are_ready_for_metric_init() -> None:
    seen: list[object] = []

    class Bounds(Histogram):
        def _metric_init(self) -> None:
            seen.append(HOOK.attribute(self, "_upper_bounds"))

        def _child_samples(self) -> Iterable[samples.Sample]:
            return ()

    Bounds("h", "doc", buckets=(0.5, 2), registry=None)
    HOOK.check(seen and list(seen[0]) == [0.5, 2.0, math.inf],  # type: ignore[call-overload]
               f"Histogram._upper_bounds at _metric_init is {seen}, not sorted floats ending "
               "in +Inf")


def test_the_created_switch_and_the_le_format() -> None:
    HOOK.check(isinstance(HOOK.attribute(prometheus_metrics, "_use_created"), bool),
               "metrics._use_created is no longer a bool")
    was = prometheus_metrics._use_created
    try:
        prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
        HOOK.check(prometheus_metrics._use_created is False,
                   "disable_created_metrics() no longer clears metrics._use_created")
        prometheus_client.enable_created_metrics()  # type: ignore[no-untyped-call]
        HOOK.check(prometheus_metrics._use_created is True,
                   "enable_created_metrics() no longer sets metrics._use_created")
    finally:
        prometheus_metrics._use_created = was
    to_go = HOOK.attribute(utils, "floatToGoString")
    HOOK.check([to_go(math.inf), to_go(0.005), to_go(1.0)] == ["+Inf", "0.005", "1.0"],
               "utils.floatToGoString writes bucket bounds differently")


def test_samples_are_built_positionally_as_ridge_builds_them() -> None:
    fields = samples.Sample._fields
    HOOK.check(fields[:5] == ("name", "labels", "value", "timestamp", "exemplar"),
               f"Sample's fields are now {fields}")
    HOOK.check(set(fields[5:]) <= set(samples.Sample._field_defaults),
               f"Sample's fields after the fifth need values now ({fields[5:]})")


def test_a_failure_names_the_library_both_versions_and_the_hook() -> None:
    """The checks can fail: a storage hook renamed, as an upgrade could leave it."""

    class Renamed:
        def _init_child(self) -> None: ...

    with pytest.raises(pytest.fail.Exception) as failed:
        HOOK.method(Renamed, "_metric_init", [])
    message = str(failed.value)
    for part in (f"prometheus-client {HOOK.installed()} is installed",
                 f"prometheus-client {WRITTEN_AGAINST}", "no attribute '_metric_init'",
                 "gateway/telemetry/lean_metrics.py"):
        assert part in message

    class Clashing:
        _counts: list[int] = []

    with pytest.raises(pytest.fail.Exception, match=r"now defines \['_counts'\]"):
        HOOK.no_clash(Clashing, OWN_HISTOGRAM)
