from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from config.fleet import parse_fleet
from gateway.telemetry.prometheus import RequestRecord, Telemetry, UnknownClasses
from gateway.telemetry.slos import ModelSlo, SloClass, SloPolicy
from routing.decision import RouteDecision
from routing.formulas import Bounds
from routing.router import RoutePlan
from routing.scheduler.framework import PluginTiming
from routing.snapshots import EndpointSnapshot
from tests.fakes.harness import HARDWARE, MODEL_FACTS


def test_tpot_is_time_after_the_first_token_per_later_token() -> None:
    # 2.0 s end to end, first token at 0.2 s, 10 tokens: 1.8 s over 9 tokens = 0.2 s/token
    assert RequestRecord("m", "p", 200, e2e_s=2.0, ttft_s=0.2,
                         completion_tokens=10).tpot_s == pytest.approx(0.2)
    assert RequestRecord("m", "p", 200, e2e_s=2.0, ttft_s=0.2, completion_tokens=1).tpot_s is None
    assert RequestRecord("m", "p", 200, e2e_s=2.0, completion_tokens=10).tpot_s is None


def test_record_labels_are_bounded() -> None:
    registry = CollectorRegistry()
    t = Telemetry(registry, frozenset({"m"}))
    t.record(RequestRecord("m", "p", 200, e2e_s=1.0, ttft_s=0.1, completion_tokens=5))
    t.record(RequestRecord("attacker-chosen-name", "none", 404, e2e_s=0.001))
    get = registry.get_sample_value
    assert get("ridge_requests_total", {"model": "m", "pool": "p", "status": "200"}) == 1
    assert get("ridge_requests_total", {"model": "other", "pool": "none", "status": "404"}) == 1
    assert get("ridge_time_per_output_token_seconds_sum",
               {"model": "m", "pool": "p", "lever": "none"}) == pytest.approx(0.225)
    assert get("ridge_request_duration_seconds_count",
               {"model": "other", "pool": "none", "lever": "none"}) is None


# -- goodput, tokens, route decisions -------------------------------------------------------------

SLOS = SloPolicy({"m": ModelSlo(Bounds(ttft_s=0.5, tpot_s=0.1, e2e_s=5.0),
                                (SloClass("long", Bounds(e2e_s=60.0), min_max_tokens=1000),))})
LABELS = {"model": "m", "pool": "p", "lever": "prefix_cache", "slo_class": "default"}


def _telemetry() -> tuple[Telemetry, CollectorRegistry]:
    registry = CollectorRegistry()
    return Telemetry(registry, frozenset({"m"}), slos=SLOS), registry


def _rec(**kw: object) -> RequestRecord:
    base: dict[str, object] = {"model": "m", "pool": "p", "status": 200, "e2e_s": 1.0,
                               "ttft_s": 0.1, "completion_tokens": 10, "lever": "prefix_cache"}
    return RequestRecord(**{**base, **kw})  # type: ignore[arg-type]


def test_goodput_counts_met_and_names_each_violated_bound() -> None:
    t, registry = _telemetry()
    t.record(_rec())                                      # met
    t.record(_rec(ttft_s=0.9))                            # ttft
    t.record(_rec(ttft_s=0.9, e2e_s=9.0))                 # ttft, tpot (8.1 s / 9), e2e
    t.record(_rec(status=503, ttft_s=None, completion_tokens=None))  # error
    t.record(_rec(status=499))                            # the client left: not evaluated
    get = registry.get_sample_value
    assert get("ridge_slo_evaluated_requests_total", LABELS) == 4
    assert get("ridge_goodput_requests_total", LABELS) == 1
    for slo, count in (("ttft", 2), ("tpot", 1), ("e2e", 1), ("error", 1)):
        assert get("ridge_slo_violations_total", {**LABELS, "slo": slo}) == count


def test_the_slo_class_follows_max_tokens_and_is_a_label() -> None:
    t, registry = _telemetry()
    t.record(_rec(e2e_s=30.0, completion_tokens=1000, max_tokens=2000))  # long: 60 s e2e
    long = {**LABELS, "slo_class": "long"}
    assert registry.get_sample_value("ridge_goodput_requests_total", long) == 1
    assert registry.get_sample_value("ridge_slo_objective_seconds",
                                     {"model": "m", "slo_class": "long", "slo": "e2e"}) == 60.0
    assert registry.get_sample_value("ridge_slo_objective_seconds",
                                     {"model": "m", "slo_class": "long", "slo": "ttft"}) == 0.5


def test_without_slos_every_answered_request_is_good() -> None:
    registry = CollectorRegistry()
    t = Telemetry(registry, frozenset({"m"}))
    t.record(_rec(e2e_s=999.0, ttft_s=99.0))
    assert registry.get_sample_value("ridge_goodput_requests_total", LABELS) == 1


def test_tokens_and_inter_token_gaps_are_counted() -> None:
    t, registry = _telemetry()
    t.record(_rec(prompt_tokens=100, cached_tokens=64, completion_tokens=4,
                  itl_s=(0.01, 0.02, 0.03)))
    t.record(_rec(prompt_tokens=50, completion_tokens=6))
    get = registry.get_sample_value
    tok = {"model": "m", "pool": "p", "lever": "prefix_cache"}
    assert get("ridge_prompt_tokens_total", tok) == 150
    assert get("ridge_completion_tokens_total", tok) == 10
    assert get("ridge_cached_prompt_tokens_total", tok) == 64
    assert get("ridge_inter_token_latency_seconds_count", tok) == 3
    assert get("ridge_inter_token_latency_seconds_sum", tok) == pytest.approx(0.06)
    assert get("ridge_request_prompt_tokens_bucket", {"model": "m", "pool": "p", "le": "64.0"}) == 1
    assert get("ridge_request_completion_tokens_count", {"model": "m", "pool": "p"}) == 2


def _plan(pool: str, lever: str, reason: str,
          timings: tuple[PluginTiming, ...] = ()) -> RoutePlan:
    return RoutePlan(RouteDecision(pool, None, lever, reason),
                     EndpointSnapshot("http://e", pool, True), timings=timings)


def test_route_decisions_are_counted_by_pool_lever_and_reason() -> None:
    t, registry = _telemetry()
    t.route(_plan("radix", "prefix_cache", "high_prefix_share"))
    t.route(_plan("radix", "prefix_cache", "high_prefix_share"))
    t.route(_plan("general", "none", "prefix>fallback_saturated"))
    get = registry.get_sample_value
    assert get("ridge_route_decisions_total", {"pool": "radix", "lever": "prefix_cache",
                                               "reason": "high_prefix_share"}) == 2
    assert get("ridge_route_decisions_total", {"pool": "general", "lever": "none",
                                               "reason": "prefix>fallback_saturated"}) == 1


def test_scheduler_plugin_timings_are_a_histogram_by_plugin_name() -> None:
    t, registry = _telemetry()
    timings = (PluginTiming("filter", "roomy", 3_000), PluginTiming("scorer", "cache_aware",
                                                                    40_000))
    t.route(_plan("p", "none", "default", timings))
    t.route(_plan("p", "none", "default", timings[:1]))
    get = registry.get_sample_value
    assert get("ridge_scheduler_plugin_duration_seconds_count", {"plugin": "roomy"}) == 2
    assert get("ridge_scheduler_plugin_duration_seconds_sum", {"plugin": "roomy"}) == \
        pytest.approx(6e-6)
    assert get("ridge_scheduler_plugin_duration_seconds_bucket",
               {"plugin": "cache_aware", "le": "2.5e-05"}) == 0
    assert get("ridge_scheduler_plugin_duration_seconds_bucket",
               {"plugin": "cache_aware", "le": "5e-05"}) == 1


def test_binding_a_fleet_takes_its_slos_and_adds_the_scrape_time_collectors() -> None:
    fleet = parse_fleet({
        "pools": [{"name": "p", "engine": "vllm", "models": ["m"],
                   "endpoints": ["http://127.0.0.1:1"], "model": MODEL_FACTS,
                   "hardware": HARDWARE}],
        "slos": {"m": {"e2e_s": 2.0}},
    })
    registry = CollectorRegistry()
    t = Telemetry(registry, frozenset({"m"}), clock=lambda: 100.0)
    collector = t.bind_fleet(fleet, lambda: ())
    assert t.bind_fleet(fleet, lambda: ()) is collector  # binding twice is a no-op
    t.record(_rec(e2e_s=3.0, endpoint="http://127.0.0.1:1", prompt_tokens=10))
    get = registry.get_sample_value
    assert get("ridge_slo_violations_total", {**LABELS, "slo": "e2e"}) == 1
    ridge = {"pool": "p", "endpoint": "http://127.0.0.1:1", "source": "ridge"}
    assert (get("ridge_estimated_flops_total", ridge) or 0) > 0  # the ledger priced it
    assert get("ridge_endpoint_up", {"pool": "p", "endpoint": "http://127.0.0.1:1"}) is None


def test_every_pools_admission_series_start_at_zero() -> None:
    registry = CollectorRegistry()
    t = Telemetry(registry, frozenset({"m"}))
    t.admission_pools(["a", "b"], ("queue_full", "would_miss_slo"))
    t.admission_refused("a", "queue_full")
    assert registry.get_sample_value("ridge_admission_rejected_total",
                                     {"pool": "a", "reason": "queue_full"}) == 1
    assert registry.get_sample_value("ridge_admission_rejected_total",
                                     {"pool": "b", "reason": "would_miss_slo"}) == 0
    assert registry.get_sample_value("ridge_admission_queue_depth", {"pool": "b"}) == 0


def test_a_request_that_ran_no_model_is_only_counted() -> None:
    registry = CollectorRegistry()
    t = Telemetry(registry, frozenset({"m"}))
    t.count(RequestRecord("m", "p", 200, e2e_s=0.002, prompt_tokens=9))
    t.count(RequestRecord("unknown", "none", 400, e2e_s=0.001))
    get = registry.get_sample_value
    assert get("ridge_requests_total", {"model": "m", "pool": "p", "status": "200"}) == 1
    assert get("ridge_requests_total", {"model": "other", "pool": "none", "status": "400"}) == 1
    labels = {"model": "m", "pool": "p", "lever": "none"}
    assert get("ridge_request_duration_seconds_count", labels) is None
    assert get("ridge_prompt_tokens_total", labels) is None
    assert get("ridge_slo_evaluated_requests_total", {**labels, "slo_class": "default"}) is None


# -- time to first byte, unknown SLO classes ---------------------------------------------------


def test_a_non_streamed_answer_has_a_time_to_first_byte_and_no_ttft() -> None:
    t, registry = _telemetry()
    t.record(_rec(ttft_s=None, ttfb_s=0.7, e2e_s=0.8))
    t.record(_rec())  # a stream: its TTFT, no TTFB
    labels = {"model": "m", "pool": "p", "lever": "prefix_cache"}
    get = registry.get_sample_value
    assert get("ridge_time_to_first_byte_seconds_count", labels) == 1
    assert get("ridge_time_to_first_byte_seconds_sum", labels) == pytest.approx(0.7)
    assert get("ridge_time_to_first_token_seconds_count", labels) == 1
    assert get("ridge_time_to_first_token_seconds_sum", labels) == pytest.approx(0.1)
    # TTFB is not a TTFT: the TTFT bound is not held against it
    assert get("ridge_slo_violations_total", {**LABELS, "slo": "ttft"}) is None


def test_an_unknown_slo_class_is_held_against_the_default_counted_and_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    t, registry = _telemetry()
    with caplog.at_level("WARNING", logger="ridge"):
        for _ in range(3):
            t.record(_rec(slo_class="bogus"))
        t.record(_rec(slo_class="long"))     # defined: honoured, not counted
        t.record(_rec(slo_class="default"))  # the default, named: fine
    get = registry.get_sample_value
    assert get("ridge_slo_class_unknown_requests_total", {"model": "m"}) == 3
    assert get("ridge_slo_evaluated_requests_total", LABELS) == 4
    assert get("ridge_slo_evaluated_requests_total", {**LABELS, "slo_class": "long"}) == 1
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "'bogus'" in lines[0] and "long" in lines[0]


def test_unknown_slo_classes_logged_are_bounded(caplog: pytest.LogCaptureFixture) -> None:
    unknown = UnknownClasses(limit=2)
    with caplog.at_level("WARNING", logger="ridge"):
        for name in ("a", "b", "c", "d", "a"):
            unknown.seen("m", name, SLOS, "default")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and "not logging" in lines[-1]


# -- reuse lost to eviction ----------------------------------------------------------------------


def test_lost_reuse_is_the_predicted_match_the_engine_did_not_serve_from_its_cache() -> None:
    t, registry = _telemetry()
    t.record(_rec(prompt_tokens=2000, cached_tokens=1024, predicted_cached_tokens=1024))  # kept
    t.record(_rec(prompt_tokens=2000, cached_tokens=256, predicted_cached_tokens=1024))  # 768
    t.record(_rec(prompt_tokens=2000, cached_tokens=1900, predicted_cached_tokens=512))  # more
    t.record(_rec(prompt_tokens=1024, cached_tokens=0, predicted_cached_tokens=1024))  # ≤ P − 1
    get = registry.get_sample_value
    assert get("ridge_prefix_predicted_tokens_total", {"pool": "p"}) == 1024 + 1024 + 512 + 1023
    assert get("ridge_prefix_lost_tokens_total", {"pool": "p"}) == 768 + 1023


def test_no_lost_reuse_series_where_the_engine_does_not_report_cached_tokens() -> None:
    t, registry = _telemetry()
    t.record(_rec(prompt_tokens=2000, predicted_cached_tokens=1024))  # no cached_tokens
    t.record(_rec(pool="q", prompt_tokens=2000, cached_tokens=64))  # no prediction (P/D)
    get = registry.get_sample_value
    assert get("ridge_prefix_predicted_tokens_total", {"pool": "p"}) is None
    assert get("ridge_prefix_lost_tokens_total", {"pool": "q"}) is None
    t.record(_rec(prompt_tokens=100, cached_tokens=0, predicted_cached_tokens=0))
    assert get("ridge_prefix_lost_tokens_total", {"pool": "p"}) == 0  # reported: a series


def test_pool_totals_sum_the_counters_the_wall_rule_reads() -> None:
    t, _ = _telemetry()
    t.record(_rec(prompt_tokens=2000, cached_tokens=256, predicted_cached_tokens=1024,
                  completion_tokens=10, ttft_s=0.1, e2e_s=1.0))
    t.record(_rec(lever="none", prompt_tokens=500, cached_tokens=0, completion_tokens=11,
                  ttft_s=0.1, e2e_s=2.1))  # TPOT (2.1 − 0.1) ÷ 10 = 0.2 s > 0.1 s
    t.record(RequestRecord("m", "none", 503, e2e_s=0.01))  # refused before routing: no pool
    totals = t.pool_totals()
    assert set(totals) == {"p"}
    p = totals["p"]
    assert (p.predicted, p.lost, p.prompt, p.cached, p.completion) == (1024, 768, 2500, 256, 21)
    assert (p.evaluated, p.tpot_violations, p.preemptions) == (2, 1, None)
