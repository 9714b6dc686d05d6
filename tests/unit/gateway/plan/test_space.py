"""gateway.plan.space: recipes, candidates and the fleet files they become."""

from __future__ import annotations

import pytest

from config.engines import Role
from config.fleet import parse_fleet
from gateway.plan.space import (
    BY_NAME,
    RECIPES,
    Brief,
    Part,
    available,
    candidate,
    fleet_document,
    policy_matters,
    uniform,
)

BRIEF = Brief("llama-3.1-8b", "nvidia-h100-sxm", ttft_s=2.0, tpot_s=0.05)


def test_every_recipe_on_its_own_is_a_fleet_file_ridge_takes() -> None:
    for recipe in RECIPES:
        if not available(recipe, BRIEF):
            continue
        for c in uniform(recipe, 4):
            fleet = parse_fleet(fleet_document(c, BRIEF))
            assert sum(len(p.endpoints) for p in fleet.pools) == c.gpus == 4
            assert fleet.slos["llama-3.1-8b"].ttft_s == 2.0


def test_a_pair_splits_its_gpus_and_names_its_decode_pool() -> None:
    splits = [(p.replicas, p.decode) for c in uniform(BY_NAME["pd"], 8) for p in c.parts]
    assert splits == [(2, 6), (4, 4), (6, 2)]
    fleet = parse_fleet(fleet_document(candidate(Part("pd", 1, 3)), BRIEF))
    prefill, decode = fleet.pools
    assert (prefill.role, prefill.pair, decode.role) == (Role.PREFILL, "pd-decode", Role.DECODE)
    assert (len(prefill.endpoints), len(decode.endpoints)) == (1, 3)
    assert not set(prefill.endpoint_urls()) & set(decode.endpoint_urls())


def test_equal_fleets_are_one_candidate_whatever_the_order() -> None:
    a = candidate(Part("fp8-kv", 2), Part("general", 2))
    b = candidate(Part("general", 1), Part("fp8-kv", 2), Part("general", 1))
    assert a == b and a.label == "fp8-kv×2 + general×2"
    with pytest.raises(ValueError):
        candidate(Part("pd", 2, 0))


def test_eagle_needs_a_draft_model_which_the_fleet_file_then_names() -> None:
    eagle = BY_NAME["spec-eagle-3"]
    assert not available(eagle, BRIEF)
    brief = Brief("llama-3.1-8b", "nvidia-h100-sxm", draft_model="d/eagle", acceptance=0.6)
    pool = fleet_document(candidate(Part(eagle.name, 2)), brief)["pools"][0]
    assert pool["levers"]["speculative"]["draft_model"] == "d/eagle"
    assert parse_fleet({"pools": [pool]}).pools[0].simulator.acceptance_rate == 0.6


def test_policy_thresholds_are_written_and_moved_only_where_they_matter() -> None:
    mixed = candidate(Part("general", 2), Part("pd", 1, 1)).with_policy("long_prompt_tokens", 4096)
    fleet = parse_fleet(fleet_document(mixed, BRIEF))
    assert fleet.policy_config().long_prompt_tokens == 4096
    alone = candidate(Part("general", 4))
    assert not any(policy_matters(alone, n) for n in ("long_prompt_tokens", "high_prefix_share"))
    assert policy_matters(mixed, "long_prompt_tokens")
    assert not policy_matters(mixed, "decode_heavy_ratio")  # no speculative pool
