"""The lever check: what a pool declares, compared with an engine's facts (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from backends.engines.facts import CHUNK_TOKENS, DRAFT_TOKENS, FACTS, MAX_CONTEXT
from backends.registry.lever_check import (
    ROUTING_LEVERS,
    LeverCheck,
    Mismatch,
    check_levers,
    declared_facts,
)
from config.fleet import parse_fleet
from config.pools import Pool
from routing.snapshots import (
    CHUNKED_PREFILL,
    FP8_KV_CACHE,
    HOST_KV_CACHE,
    PREFIX_CACHE,
    SPECULATIVE,
)

OFF = {FP8_KV_CACHE: False, HOST_KV_CACHE: False}  # the capacity levers, when not declared

MODEL: dict[str, Any] = {"params": 1e8, "layers": 2, "hidden_size": 64, "kv_heads": 1,
                         "head_dim": 64, "dtype_bytes": 2}


def make_pool(levers: dict[str, Any] | None = None, **model: Any) -> Pool:
    raw = {"name": "p", "engine": "vllm", "models": ["m"], "endpoints": ["http://e:8000"],
           "levers": levers or {}, "model": {**MODEL, **model},
           "hardware": {"peak_flops": 1e12, "mem_bandwidth": 1e11}}
    return parse_fleet({"pools": [raw]}).pools[0]


@pytest.mark.parametrize(("levers", "model", "expected"), [
    ({}, {}, {PREFIX_CACHE: False, CHUNKED_PREFILL: False, SPECULATIVE: False, **OFF}),
    ({"prefix_caching": True, "chunked_prefill": {"token_budget": 512}}, {"max_context": 2048},
     {PREFIX_CACHE: True, CHUNKED_PREFILL: True, CHUNK_TOKENS: 512, SPECULATIVE: False,
      MAX_CONTEXT: 2048, **OFF}),
    ({"chunked_prefill": {"enabled": False, "token_budget": 512}}, {},
     {PREFIX_CACHE: False, CHUNKED_PREFILL: False, SPECULATIVE: False, **OFF}),
    ({"speculative": {"method": "ngram", "num_draft_tokens": 3}}, {},
     {PREFIX_CACHE: False, CHUNKED_PREFILL: False, SPECULATIVE: True, DRAFT_TOKENS: 3, **OFF}),
    ({"prefix_caching": True, "kv_cache_dtype": "fp8", "host_kv_cache": {"size_gb": 16}}, {},
     {PREFIX_CACHE: True, CHUNKED_PREFILL: False, SPECULATIVE: False, FP8_KV_CACHE: True,
      HOST_KV_CACHE: True}),
    ({"kv_cache_dtype": "auto"}, {},
     {PREFIX_CACHE: False, CHUNKED_PREFILL: False, SPECULATIVE: False, **OFF}),
])
def test_what_a_pool_declares(levers: dict[str, Any], model: dict[str, Any],
                              expected: dict[str, Any]) -> None:
    assert declared_facts(make_pool(levers, **model)) == expected


def test_max_context_only_when_the_fleet_file_says_it() -> None:
    """The field's default (4096) is not a claim about the engine; no model facts: no claim."""
    assert MAX_CONTEXT not in declared_facts(make_pool())
    assert declared_facts(make_pool(max_context=4096))[MAX_CONTEXT] == 4096
    without_model = make_pool(max_context=4096).model_copy(update={"model": None})
    assert MAX_CONTEXT not in declared_facts(without_model)


DECLARED = {PREFIX_CACHE: True, CHUNKED_PREFILL: True, CHUNK_TOKENS: 512, SPECULATIVE: False,
            MAX_CONTEXT: 2048}


def test_everything_as_declared() -> None:
    check = check_levers(DECLARED, dict(DECLARED))
    assert check == LeverCheck(checked=(PREFIX_CACHE, CHUNKED_PREFILL, CHUNK_TOKENS, SPECULATIVE,
                                        MAX_CONTEXT))


def test_unknown_is_not_a_mismatch() -> None:
    check = check_levers(DECLARED, {PREFIX_CACHE: True, SPECULATIVE: False})
    assert check.checked == (PREFIX_CACHE, SPECULATIVE) and check.mismatches == ()
    assert check_levers(DECLARED, {}) == LeverCheck()
    assert check_levers({}, DECLARED) == LeverCheck()  # nothing declared: nothing checked


def test_mismatches_and_the_levers_the_router_loses() -> None:
    observed = {PREFIX_CACHE: False, CHUNKED_PREFILL: True, CHUNK_TOKENS: 8192,
                SPECULATIVE: True, MAX_CONTEXT: 2048}
    check = check_levers(DECLARED, observed)
    assert check.mismatches == (Mismatch(PREFIX_CACHE, True, False),
                                Mismatch(CHUNK_TOKENS, 512, 8192),
                                Mismatch(SPECULATIVE, False, True))
    # only a lever declared on and found off is missing; an extra lever or another budget is
    # reported, not acted on
    assert check.missing == {PREFIX_CACHE}
    assert check.mismatched(SPECULATIVE) and not check.mismatched(MAX_CONTEXT)


def test_every_router_lever_can_go_missing() -> None:
    declared = {PREFIX_CACHE: True, CHUNKED_PREFILL: True, SPECULATIVE: True, DRAFT_TOKENS: 4}
    observed = {PREFIX_CACHE: False, CHUNKED_PREFILL: False, SPECULATIVE: False}
    assert check_levers(declared, observed).missing == {PREFIX_CACHE, CHUNKED_PREFILL,
                                                        SPECULATIVE}


def test_a_mismatch_reads_well() -> None:
    assert Mismatch(SPECULATIVE, True, False).describe() == (
        "declared on, the engine reports off")
    assert Mismatch(MAX_CONTEXT, 2048, 4096).describe() == (
        "declared 2048, the engine reports 4096")


def test_capacity_levers_are_router_levers_declared_but_not_read_from_engines_yet() -> None:
    assert {FP8_KV_CACHE, HOST_KV_CACHE} <= ROUTING_LEVERS
    declared = declared_facts(make_pool({"prefix_caching": True, "kv_cache_dtype": "fp8"}))
    assert declared[FP8_KV_CACHE] is True and declared[HOST_KV_CACHE] is False
    # no engine fact table reads them (backends.engines.facts.FACTS): never checked
    assert not {FP8_KV_CACHE, HOST_KV_CACHE} & set(FACTS)
    check = check_levers(declared, {PREFIX_CACHE: True, FP8_KV_CACHE: False})
    assert check.checked == (PREFIX_CACHE,) and check.missing == frozenset()
