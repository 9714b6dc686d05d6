from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client import metrics as prometheus_metrics

from gateway.telemetry.lean_metrics import Buckets, LeanCounter, LeanHistogram, Tally

BUCKETS = (0.005, 0.1, 1.0, 10.0)
VALUES = (0.0, 0.005, 0.0051, 0.1, 0.7, 1.0, 9.99, 10.0, 10.5, 1e9)


def page(registry: CollectorRegistry) -> str:
    """The exposition with the creation times blanked (they differ by construction)."""
    text = generate_latest(registry).decode()
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", text)


def both(kind: str) -> tuple[CollectorRegistry, CollectorRegistry, object, object]:
    plain, lean = CollectorRegistry(), CollectorRegistry()
    if kind == "histogram":
        return (plain, lean,
                Histogram("x_seconds", "doc", ("a", "b"), buckets=BUCKETS, registry=plain),
                LeanHistogram("x_seconds", "doc", ("a", "b"), buckets=BUCKETS, registry=lean))
    return (plain, lean, Counter("x", "doc", ("a",), registry=plain),
            LeanCounter("x", "doc", ("a",), registry=lean))


def test_a_histogram_exposes_what_prometheus_clients_does_for_the_same_values() -> None:
    plain_registry, lean_registry, plain, lean = both("histogram")
    assert isinstance(plain, Histogram) and isinstance(lean, LeanHistogram)
    for i, v in enumerate(VALUES):
        plain.labels(str(i % 3), "b").observe(v)
        lean.labels(str(i % 3), "b").observe(v)
    assert page(lean_registry) == page(plain_registry)
    text = page(lean_registry)
    assert 'x_seconds_bucket{a="1",b="b",le="0.005"} 1.0' in text  # 0.005: a bound holds itself
    assert 'x_seconds_bucket{a="1",b="b",le="0.1"} 1.0' in text
    assert 'x_seconds_bucket{a="1",b="b",le="+Inf"} 3.0' in text  # 0.005, 0.7 and 10.0


def test_observe_all_counts_each_value_as_observe_does() -> None:
    registry = CollectorRegistry()
    one = LeanHistogram("one_seconds", "doc", buckets=BUCKETS, registry=registry)
    many = LeanHistogram("many_seconds", "doc", buckets=BUCKETS, registry=registry)
    for v in VALUES:
        one.observe(v)
    many.observe_all(VALUES)
    many.observe_all(())
    families = {f.name: [(s.name.split("_seconds")[1], s.labels, s.value) for s in f.samples
                         if not s.name.endswith("_created")] for f in registry.collect()}
    assert families["many_seconds"] == families["one_seconds"]
    sample = registry.get_sample_value
    assert sample("many_seconds_sum") == pytest.approx(sum(VALUES))
    assert sample("many_seconds_count") == len(VALUES)


def test_a_counter_exposes_what_prometheus_clients_does_and_refuses_to_go_down() -> None:
    plain_registry, lean_registry, plain, lean = both("counter")
    assert isinstance(plain, Counter) and isinstance(lean, LeanCounter)
    for child in (plain.labels("p"), lean.labels("p")):
        child.inc()
        child.inc(2.5)
    lean.labels("q")  # a series exists from its first look-up, at 0
    plain.labels("q")
    assert page(lean_registry) == page(plain_registry)
    assert lean_registry.get_sample_value("x_total", {"a": "p"}) == 3.5
    with pytest.raises(ValueError, match="non-negative"):
        lean.labels("p").inc(-1)


def test_a_series_native_values_are_what_its_exposition_shows() -> None:
    """The request path updates a series' Tally and Buckets directly (Telemetry.record): the
    same series as the child's own inc and observe."""
    plain_registry, lean_registry = CollectorRegistry(), CollectorRegistry()
    plain_counter = Counter("x", "doc", ("a",), registry=plain_registry)
    plain_histogram = Histogram("y_seconds", "doc", ("a",), buckets=BUCKETS,
                                registry=plain_registry)
    counter = LeanCounter("x", "doc", ("a",), registry=lean_registry)
    histogram = LeanHistogram("y_seconds", "doc", ("a",), buckets=BUCKETS, registry=lean_registry)
    tally, buckets = counter.labels("p").tally, histogram.labels("p").buckets
    assert isinstance(tally, Tally) and isinstance(buckets, Buckets)
    tally.add(2.0)
    counter.labels("p").inc(0.5)
    plain_counter.labels("p").inc(2.5)
    buckets.observe_all(VALUES[:4])
    for v in VALUES:
        plain_histogram.labels("p").observe(v)
    for v in VALUES[4:]:
        buckets.observe(v)
    assert page(lean_registry) == page(plain_registry)
    with pytest.raises(ValueError, match="non-negative"):
        tally.add(-1.0)


def test_labels_remove_and_clear_are_prometheus_clients() -> None:
    registry = CollectorRegistry()
    lean = LeanHistogram("z_seconds", "doc", ("a",), buckets=BUCKETS, registry=registry)
    lean.labels("gone").observe(1.0)
    lean.labels("kept").observe(1.0)
    lean.remove("gone")
    assert registry.get_sample_value("z_seconds_count", {"a": "gone"}) is None
    assert registry.get_sample_value("z_seconds_count", {"a": "kept"}) == 1
    lean.clear()
    assert registry.get_sample_value("z_seconds_count", {"a": "kept"}) is None


def test_the_created_series_follow_prometheus_clients_switch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    registry = CollectorRegistry()
    LeanCounter("c", "doc", registry=registry).inc()
    LeanHistogram("h_seconds", "doc", buckets=BUCKETS, registry=registry).observe(1.0)
    assert registry.get_sample_value("c_created") is not None
    assert registry.get_sample_value("h_seconds_created") is not None
    monkeypatch.setattr(prometheus_metrics, "_use_created", False)
    assert registry.get_sample_value("c_created") is None
    assert registry.get_sample_value("h_seconds_created") is None
    assert registry.get_sample_value("c_total") == 1
