"""gateway.telemetry.page: the /metrics page leaves out the _created series unless asked."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from gateway.telemetry.lean_metrics import LeanCounter, LeanHistogram
from gateway.telemetry.page import page


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    LeanCounter("ridge_x", "x", ("pool",), registry=registry).labels("p").inc(3)
    LeanHistogram("ridge_y_seconds", "y", buckets=(1.0,), registry=registry).observe(0.5)
    Gauge("ridge_z_created", "a gauge whose own name ends so", registry=registry).set(7)
    return registry


def test_the_page_has_no_created_series_unless_asked() -> None:
    text = page(_registry()).decode()
    assert 'ridge_x_total{pool="p"} 3.0' in text and "ridge_y_seconds_count 1.0" in text
    assert "ridge_x_created" not in text and "ridge_y_seconds_created" not in text
    assert "ridge_z_created 7.0" in text  # a family's own samples stay, whatever their name
    asked = page(_registry(), created=True).decode()
    assert 'ridge_x_created{pool="p"}' in asked and "ridge_y_seconds_created" in asked
    assert asked.replace("\n", "").count("# TYPE") > text.count("# TYPE")
