"""Pins of ``gateway/telemetry/prometheus.py``: it types its metrics (and the children it
binds once, :meth:`Telemetry.child`) with ``prometheus_client.metrics.MetricWrapperBase``,
which prometheus_client does not export or document, and calls ``labels`` and ``collect`` on
it. These tests fail, naming prometheus_client's versions and the hook, when an upgrade
changed it."""

from __future__ import annotations

import pytest
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client import metrics as prometheus_metrics

from tests.unit.library_pins import Hook

WRITTEN_AGAINST = "0.26.0"
"""The prometheus_client release Telemetry's metric typing was written against."""

HOOK = Hook("prometheus-client", WRITTEN_AGAINST,
            "Telemetry.child and _by_pool (MetricWrapperBase) in gateway/telemetry/prometheus.py")


def test_the_installed_prometheus_client_is_the_minor_release_the_hook_was_checked_against(
) -> None:
    HOOK.check_version()
    HOOK.check_pin()


def test_the_metric_base_class_and_what_ridge_calls_on_it() -> None:
    base = HOOK.attribute(prometheus_metrics, "MetricWrapperBase")
    for cls in (Counter, Gauge, Histogram):
        HOOK.check(issubclass(cls, base), f"{cls.__name__} is no longer a MetricWrapperBase")
    HOOK.method(base, "labels", ["labelvalues", "labelkwargs"])
    HOOK.method(base, "collect", [])


def test_a_failure_names_the_library_both_versions_and_the_hook() -> None:
    """The checks can fail: the base class gone from the module, as an upgrade could leave."""
    with pytest.raises(pytest.fail.Exception) as failed:
        HOOK.attribute(object(), "MetricWrapperBase")
    message = str(failed.value)
    for part in (f"prometheus-client {HOOK.installed()} is installed",
                 f"prometheus-client {WRITTEN_AGAINST}", "no attribute 'MetricWrapperBase'",
                 "gateway/telemetry/prometheus.py"):
        assert part in message
