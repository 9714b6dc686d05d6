"""The fleet file's routing section: the lever policy, the replica scheduler, and the
tokenizers for exact prompt tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from config.fleet import FleetConfigError, load_fleet, parse_fleet
from config.routing_section import TokenizerSettings
from tests.unit.config.fleets import pool


def test_routing_defaults_are_routings_own() -> None:
    from routing.policy import PolicyConfig
    from routing.scheduler.framework import SchedulerConfig

    fleet = parse_fleet({"pools": [pool()]})
    assert fleet.policy_config() == PolicyConfig()
    assert fleet.scheduler_config("p") == SchedulerConfig()


def test_routing_overrides() -> None:
    raw = {
        "pools": [pool(), pool(name="q", endpoints=["http://h:2"],
                               scheduler={"filters": [], "scorers": {"least_load": 2},
                                          "picker": "round_robin"})],
        "routing": {
            "policy": {"long_prompt_tokens": 4096, "high_prefix_share": 0.7,
                       "spec_max_ridge_fraction": 0.2, "idle_spec_fraction": 0.1,
                       "idle_spec_margin": 2.5, "rules": ["prefix", "default"]},
            "scheduler": {"scorers": {"cache_aware": 1, "session_affinity": 0.5},
                          "picker": "random_top", "seed": 3},
        },
    }
    fleet = parse_fleet(raw)
    policy = fleet.policy_config()
    assert (policy.long_prompt_tokens, policy.high_prefix_share, policy.spec_max_ridge_fraction,
            policy.rules) == (4096, 0.7, 0.2, ("prefix", "default"))
    assert (policy.idle_spec_fraction, policy.idle_spec_margin) == (0.1, 2.5)
    assert policy.long_match_blocks == 8  # untouched fields keep routing's defaults
    fleet_wide = fleet.scheduler_config("p")
    assert fleet_wide.scorers == (("cache_aware", 1.0), ("session_affinity", 0.5))
    assert (fleet_wide.filters, fleet_wide.picker, fleet_wide.seed) == (
        ("healthy",), "random_top", 3)
    own = fleet.scheduler_config("q")
    assert (own.filters, own.scorers, own.picker) == ((), (("least_load", 2.0),), "round_robin")


def test_the_idle_spec_rule_is_on_by_default_and_can_be_turned_off() -> None:
    assert "idle_spec" in parse_fleet({"pools": [pool()]}).policy_config().rules
    off = parse_fleet(routing(policy={"rules": ["pd", "spec", "prefix", "default"]}))
    assert off.policy_config().rules == ("pd", "spec", "prefix", "default")
    assert parse_fleet(routing(policy={"idle_spec_fraction": 0})).policy_config() \
        .idle_spec_fraction == 0.0


def test_routing_settings_build_working_routers() -> None:
    from routing.policy import LeverPolicy
    from routing.scheduler.catalog import build_scheduler

    fleet = parse_fleet({"pools": [pool(scheduler={"scorers": {"prefix_match": 1,
                                                                "least_load": 1}})]})
    LeverPolicy(fleet.policy_config())
    build_scheduler(fleet.scheduler_config("p"))


def routing(**section: Any) -> dict[str, Any]:
    return {"pools": [pool()], "routing": section}


@pytest.mark.parametrize(
    ("raw", "field", "problem"),
    [
        (routing(scheduler={"scorers": {"cache_awre": 1}}), "routing.scheduler",
         "unknown scorer 'cache_awre'; known: cache_aware, footprint, least_load"),
        (routing(scheduler={"scorers": {"cache_aware": None}}), "routing.scheduler.scorers",
         "scorer 'cache_aware' has no weight"),
        (routing(scheduler={"scorers": ["cache_aware"]}), "routing.scheduler.scorers",
         "every scorer needs a weight"),
        (routing(scheduler={"scorers": {"cache_aware": 0}}),
         "routing.scheduler.scorers.cache_aware", "greater than 0"),
        (routing(scheduler={"filters": ["healthy", "warm"]}), "routing.scheduler",
         "unknown filter 'warm'"),
        (routing(scheduler={"picker": "best"}), "routing.scheduler",
         "unknown picker 'best'"),
        (routing(plugins=[{"name": "roomy", "type": "not_saturated",
                           "parameters": {"max_wait": 1}}],
                 scheduler={"filters": ["roomy"]}), "routing.scheduler",
         "filter 'roomy' (not_saturated): unknown parameter(s) ['max_wait']; known: max_waiting"),
        (routing(plugins=[{"name": "roomy", "type": "warmest"}]), "routing.scheduler",
         "plugin 'roomy': unknown type 'warmest'"),
        (routing(plugins=[{"name": "bad name!", "type": "healthy"}]), "routing.plugins.0.name",
         "should match pattern"),
        (routing(features={"tokenizers": {"gpt-9": "t.json"}}), "routing.features.tokenizers",
         "names models no pool serves: ['gpt-9']"),
        (routing(features={"block_tokens": 0}), "routing.features.block_tokens",
         "greater than 0"),
        (routing(scheduler={"weights": {}}), "routing.scheduler.weights",
         "Extra inputs are not permitted"),
        ({"pools": [pool(scheduler={"scorers": {"lru": 1}})]}, "pools.0.scheduler",
         "unknown scorer 'lru'"),
        (routing(policy={"rules": ["prefix", "radix"]}), "routing.policy.rules",
         "unknown rules ['radix']"),
        (routing(policy={"rules": ["prefix", "prefix"]}), "routing.policy.rules", "listed twice"),
        (routing(policy={"high_prefix_share": 1.5}), "routing.policy.high_prefix_share",
         "less than or equal to 1"),
        (routing(policy={"long_prompt_tokens": 0}), "routing.policy.long_prompt_tokens",
         "greater than 0"),
        (routing(policy={"spec_max_ridge_fraction": 0}), "routing.policy.spec_max_ridge_fraction",
         "greater than 0"),
        (routing(policy={"idle_spec_fraction": 1.5}), "routing.policy.idle_spec_fraction",
         "less than or equal to 1"),
        (routing(policy={"idle_spec_margin": -1}), "routing.policy.idle_spec_margin",
         "greater than or equal to 0"),
        (routing(policy={"long_prompt": 10}), "routing.policy.long_prompt",
         "Extra inputs are not permitted"),
        (routing(colour="red"), "routing.colour", "Extra inputs are not permitted"),
    ],
)
def test_bad_routing_settings_name_the_field_and_problem(raw: dict[str, Any], field: str,
                                                         problem: str) -> None:
    with pytest.raises(FleetConfigError) as info:
        parse_fleet(raw, source="fleet.yaml")
    message = str(info.value)
    assert message.startswith("fleet.yaml: ")
    assert f"  {field}: " in message and problem in message, message


def test_routing_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "pools:\n"
        "  - {name: p, engine: vllm, models: [m], endpoints: ['http://h:1'],\n"
        "     model: {params: 1e9, layers: 2, hidden_size: 8, kv_heads: 1, head_dim: 8,\n"
        "             dtype_bytes: 2},\n"
        "     hardware: {peak_flops: 1e12, mem_bandwidth: 1e11}}\n"
        "routing:\n"
        "  scheduler:\n"
        "    scorers: {cache_aware: }\n"
    )
    with pytest.raises(FleetConfigError) as info:
        load_fleet(path)
    assert str(info.value).startswith(f"{path}: ")
    assert "routing.scheduler.scorers: " in str(info.value)
    assert "has no weight" in str(info.value)


def test_a_tokenizer_is_a_path_or_its_settings() -> None:
    raw = {"pools": [pool(models=["m", "n"])], "routing": {"features": {"tokenizers": {
        "m": "tok.json",
        "n": {"path": "folder", "chat_template": "t.jinja", "content_format": "openai",
              "required": False}}}}}
    tokenizers = parse_fleet(raw).routing.features.tokenizers
    assert tokenizers["m"] == TokenizerSettings(path="tok.json")
    assert tokenizers["m"].required and tokenizers["m"].content_format == "auto"
    assert tokenizers["n"] == TokenizerSettings(path="folder", chat_template="t.jinja",
                                                content_format="openai", required=False)


def test_bad_tokenizer_settings_name_the_field() -> None:
    raw = {"pools": [pool()], "routing": {"features": {"tokenizers": {
        "m": {"path": "x", "content_format": "html"}}}}}
    with pytest.raises(FleetConfigError, match="content_format"):
        parse_fleet(raw)
