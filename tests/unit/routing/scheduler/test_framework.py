from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence

import pytest

from routing.scheduler.catalog import build_scheduler
from routing.scheduler.framework import (
    Scheduler,
    SchedulerConfig,
    SchedulingContext,
    clamp,
    top,
)
from routing.scheduler.plugins.healthy import Healthy
from routing.scheduler.plugins.max_score import MaxScore
from routing.snapshots import EndpointSnapshot
from tests.unit.routing.scheduler.snapshots import ctx, ep, features, scored, view


class FixedScorer:
    """Scores by URL, given in the candidates' order (a URL not named scores 0)."""

    def __init__(self, scores: Mapping[str, float]) -> None:
        self.scores = scores
        self.calls = 0

    def score(self, ctx: SchedulingContext,
              candidates: Sequence[EndpointSnapshot]) -> list[float]:
        self.calls += 1
        return [self.scores.get(e.url, 0.0) for e in candidates]


class ShortScorer:
    def score(self, ctx: SchedulingContext,
              candidates: Sequence[EndpointSnapshot]) -> list[float]:
        return [1.0] * (len(candidates) - 1)


class DropAll:
    def filter(self, ctx: SchedulingContext,
               candidates: Sequence[EndpointSnapshot]) -> Sequence[EndpointSnapshot]:
        return []


def ticking_clock(step: int = 10) -> Iterator[int]:
    n = 0
    while True:
        yield n
        n += step


@pytest.mark.parametrize(
    ("raw", "clamped"),
    [(0.4, 0.4), (-2.0, 0.0), (1.5, 1.0), (math.nan, 0.0), (math.inf, 1.0), (-math.inf, 0.0)],
)
def test_clamp(raw: float, clamped: float) -> None:
    assert clamp(raw) == clamped


def test_scores_are_clamped_then_weighted_and_summed() -> None:
    endpoints = [ep("a"), ep("b"), ep("c")]
    s1 = FixedScorer({"a": 2.0, "b": 0.5, "c": 0.25})
    s2 = FixedScorer({"a": -1.0, "b": math.nan})  # c: 0
    s3 = FixedScorer({"c": 1.0})
    scheduler = Scheduler([], [("s1", s1, 3.0), ("s2", s2, 1.0), ("s3", s3, 0.5)],
                          ("max_score", MaxScore()))
    result = scheduler.schedule(ctx(endpoints))
    # a = 3·1 + 1·0 + 0 ; b = 3·0.5 + 0 + 0 ; c = 3·0.25 + 0 + 0.5·1
    assert result.scores == pytest.approx({"a": 3.0, "b": 1.5, "c": 1.25})
    assert result.endpoint is not None and result.endpoint.url == "a"


def test_a_scorer_that_skips_a_candidate_is_an_error() -> None:
    scheduler = Scheduler([], [("short", ShortScorer(), 1.0)], ("max_score", MaxScore()))
    with pytest.raises(ValueError, match="scorer 'short' gave 1 scores for 2 candidates"):
        scheduler.schedule(ctx([ep("a"), ep("b")]))


def test_weights_change_the_pick() -> None:
    endpoints = [ep("a"), ep("b")]
    prefers_a, prefers_b = FixedScorer({"a": 1.0}), FixedScorer({"b": 0.6})
    light = Scheduler([], [("x", prefers_a, 1.0), ("y", prefers_b, 1.0)], ("m", MaxScore()))
    heavy = Scheduler([], [("x", prefers_a, 1.0), ("y", prefers_b, 2.0)], ("m", MaxScore()))
    assert light.schedule(ctx(endpoints)).endpoint == endpoints[0]
    assert heavy.schedule(ctx(endpoints)).endpoint == endpoints[1]


def test_every_plugin_is_timed_in_run_order() -> None:
    clock = ticking_clock(10)
    scheduler = Scheduler([("healthy", Healthy())],
                          [("s1", FixedScorer({}), 1.0), ("s2", FixedScorer({}), 1.0)],
                          ("max_score", MaxScore()), clock=lambda: next(clock))
    result = scheduler.schedule(ctx([ep("a")]))
    assert [(t.stage, t.name, t.ns) for t in result.timings] == [
        ("filter", "healthy", 10), ("scorer", "s1", 10), ("scorer", "s2", 10),
        ("picker", "max_score", 10),
    ]


def test_real_clock_timings_are_non_negative() -> None:
    result = build_scheduler(SchedulerConfig()).schedule(ctx([ep("a")]))
    assert [t.name for t in result.timings] == ["healthy", "cache_aware", "footprint", "max_score"]
    assert all(isinstance(t.ns, int) and t.ns >= 0 for t in result.timings)


def test_filters_emptying_candidates_give_no_pick_and_stop_the_run() -> None:
    scorer = FixedScorer({"a": 1.0})
    scheduler = Scheduler([("drop", DropAll()), ("healthy", Healthy())],
                          [("s", scorer, 1.0)], ("max_score", MaxScore()))
    result = scheduler.schedule(ctx([ep("a"), ep("b")]))
    assert result.endpoint is None and result.scores == {}
    assert [t.name for t in result.timings] == ["drop"]
    assert scorer.calls == 0


def test_unhealthy_only_pool_gives_no_pick() -> None:
    result = build_scheduler(SchedulerConfig()).schedule(ctx([ep("a", healthy=False)]))
    assert result.endpoint is None


def test_excluded_endpoints_are_never_candidates() -> None:
    scheduler = build_scheduler(SchedulerConfig())
    endpoints = [ep("a"), ep("b")]
    busy_b = view(load={"b": 5})
    assert scheduler.schedule(ctx(endpoints, state=busy_b)).endpoint == endpoints[0]
    assert scheduler.schedule(ctx(endpoints, state=busy_b, exclude={"a"})).endpoint == endpoints[1]
    assert scheduler.schedule(ctx(endpoints, exclude={"a", "b"})).endpoint is None


def test_no_scorers_means_every_candidate_ties() -> None:
    scheduler = build_scheduler(SchedulerConfig(scorers=(), picker="round_robin"))
    endpoints = [ep("a"), ep("b"), ep("c")]
    picks = [scheduler.schedule(ctx(endpoints)).endpoint for _ in range(4)]
    assert [p.url for p in picks if p] == ["a", "b", "c", "a"]


def test_default_config_is_healthy_cache_aware_footprint_max_score() -> None:
    config = SchedulerConfig()
    assert (config.filters, config.scorers, config.picker) == (
        ("healthy",), (("cache_aware", 1.0), ("footprint", 3.0)), "max_score")
    # the cached endpoint wins unless it is unhealthy, whatever the footprints
    endpoints = [ep("a"), ep("b")]
    sizes = {"a": 900, "b": 1000}
    measures = {"recent_requests": sizes.__getitem__, "footprint": sizes.__getitem__}
    state = view(matched={"b": 8}).replaced(**measures)
    scheduler = build_scheduler(config)
    assert scheduler.schedule(ctx(endpoints, features(), state)).endpoint == endpoints[1]
    sick = [ep("a"), ep("b", healthy=False)]
    assert scheduler.schedule(ctx(sick, features(), state)).endpoint == sick[0]
    # new work (nothing cached): the smaller footprint (a: 1 + 3 × 1 against b: 1 + 3 × 0),
    # also when its endpoint is busier by up to the slack (a: 1/3 + 3 with 2 in flight) ...
    for load in ({"a": 1, "b": 1}, {"a": 2}):
        new = view(load=load).replaced(**measures)
        assert scheduler.schedule(ctx(endpoints, features(), new)).endpoint == endpoints[0]
    # ... and never when more than the slack (2 requests) above the least loaded
    busy = view(load={"a": 3}).replaced(**measures)
    assert scheduler.schedule(ctx(endpoints, features(), busy)).endpoint == endpoints[1]


def test_each_scheduler_has_its_own_plugin_state() -> None:
    config = SchedulerConfig(scorers=(), picker="round_robin")
    one, two = build_scheduler(config), build_scheduler(config)
    endpoints = [ep("a"), ep("b")]
    assert one.schedule(ctx(endpoints)).endpoint == endpoints[0]
    assert one.schedule(ctx(endpoints)).endpoint == endpoints[1]
    assert two.schedule(ctx(endpoints)).endpoint == endpoints[0]


def test_top_keeps_ties_within_rounding() -> None:
    candidates, totals = scored({"a": 0.1 + 0.2, "b": 0.3, "c": 0.29})
    assert [e.url for e in top(candidates, totals)] == ["a", "b"]
    assert top([], []) == []


def test_timings_are_a_regular_sample_of_the_calls() -> None:
    scheduler = Scheduler([("healthy", Healthy())], [], ("max_score", MaxScore()), time_every=4)
    timed = [bool(scheduler.schedule(ctx([ep("a")])).timings) for _ in range(9)]
    assert timed == [True, False, False, False, True, False, False, False, True]
