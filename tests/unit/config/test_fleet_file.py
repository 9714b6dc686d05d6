from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from config.fleet_file import (
    KV_CACHE_DTYPE_BYTES,
    KV_EVENT_ENGINES,
    Engine,
    FleetConfigError,
    KvEventSource,
    Role,
    TokenizerSettings,
    expand_variables,
    load_fleet,
    parse_fleet,
    pool_levers,
)
from routing.formulas import HardwareRates, ModelShape
from routing.snapshots import FP8_KV_CACHE, HOST_KV_CACHE, LEVERS, PREFIX_CACHE

ROOT = Path(__file__).resolve().parents[3]
FACTS = {"params": 1e9, "layers": 2, "hidden_size": 8, "kv_heads": 1, "head_dim": 8,
         "dtype_bytes": 2}
HW = {"peak_flops": 1e12, "mem_bandwidth": 1e11}


def pool(**over: Any) -> dict[str, Any]:
    return {"name": "p", "engine": "vllm", "models": ["m"], "endpoints": ["http://h:1"],
            "model": FACTS, "hardware": HW, **over}


@pytest.mark.parametrize("name", ["deploy/fleet.example.yaml", "gateway/demo/demo-fleet.yaml",
                                  "gateway/demo/demo-real-fleet.yaml"])
def test_shipped_fleet_files_load(name: str) -> None:
    path = ROOT / name
    if not path.exists():
        pytest.fail(f"{path} is missing")
    fleet = load_fleet(path)
    assert fleet.pools


def test_defaults() -> None:
    fleet = parse_fleet({"pools": [pool()]})
    p = fleet.pools[0]
    assert p.role is Role.MIXED and not p.levers.prefix_caching and p.levers.speculative is None
    assert p.endpoint_urls() == ["http://h:1"]


def test_facts_become_the_fleet_arithmetics_dataclasses() -> None:
    p = parse_fleet({"pools": [pool()]}).pools[0]
    assert p.model.to_shape() == ModelShape(1e9, 2, 8, 1, 8, 2.0)
    assert p.model.to_shape(kv_dtype_bytes=1).kv_bytes_per_token == 2 * 2 * 1 * 8 * 1
    assert p.hardware.to_rates() == HardwareRates(1e12, 1e11)


@pytest.mark.parametrize(
    ("raw", "field", "problem"),
    [
        ({"pools": [pool(engine="tgi")]}, "pools.0.engine", "'vllm' or 'sglang'"),
        ({"pools": [pool(endpoints=[])]}, "pools.0.endpoints", "at least 1"),
        ({"pools": [pool(endpoints=["not a url"])]}, "pools.0.endpoints.0", "URL"),
        ({"pools": [pool(model={**FACTS, "layers": 0})]}, "pools.0.model.layers", "greater than 0"),
        ({"pools": [pool(hardware={"peak_flops": 1})]}, "pools.0.hardware.mem_bandwidth",
         "Field required"),
        ({"pools": [pool(levers={"speculative": {"num_draft_tokens": -1}})]},
         "pools.0.levers.speculative.num_draft_tokens", "greater than 0"),
        ({"pools": [pool(colour="red")]}, "pools.0.colour", "Extra inputs are not permitted"),
        ({"pools": [pool(), pool()]}, "(top level)", "pool names must be unique"),
        ({"pools": [pool(), pool(name="q")]}, "(top level)", "an endpoint belongs to one pool"),
        ({"pools": [pool(role="prefill")]}, "(top level)", "needs 'pair'"),
        ({"pools": [pool(role="prefill", pair="p2"), pool(name="p2", endpoints=["http://h:2"])]},
         "(top level)", "is not a decode pool"),
        ({"pools": []}, "pools", "at least 1"),
        ({"pools": [pool(levers={"speculative": {"method": "ngram"}},
                         simulator={"acceptance_rate": 0.7})]},
         "pools.0", "simulator.acceptance_rate: an n-gram pool's acceptance is computed"),
        ({"pools": [pool(simulator={"acceptance_by_position": [0.8, 1.2]})]},
         "pools.0.simulator.acceptance_by_position.1", "less than 1"),
    ],
)
def test_bad_fleets_name_the_field_and_problem(raw: dict[str, Any], field: str,
                                                problem: str) -> None:
    with pytest.raises(FleetConfigError) as info:
        parse_fleet(raw, source="fleet.yaml")
    message = str(info.value)
    assert message.startswith("fleet.yaml: ")
    assert f"{field}: " in message and problem in message, message


def test_unreadable_and_malformed_files_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(FleetConfigError, match="missing.yaml: cannot read"):
        load_fleet(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: [\n")
    with pytest.raises(FleetConfigError, match="bad.yaml: not valid YAML"):
        load_fleet(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(FleetConfigError, match="scalar.yaml: expected a mapping"):
        load_fleet(scalar)


# --- routing: the lever policy and the replica scheduler ----------------------------------


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


def test_checkpoint_and_engine_args() -> None:
    (plain,) = parse_fleet({"pools": [pool()]}).pools
    assert plain.checkpoint is None and plain.engine_args == []
    extra = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    (p,) = parse_fleet({"pools": [pool(checkpoint="org/m", engine_args=extra)]}).pools
    assert p.checkpoint == "org/m" and p.engine_args == extra
    with pytest.raises(FleetConfigError, match="pools.0.engine_args"):
        parse_fleet({"pools": [pool(engine_args="--flag")]})


# --- model and hardware facts: a catalogue name, full facts, or none -------------------------


def test_facts_by_catalogue_name() -> None:
    (p,) = parse_fleet({"pools": [pool(model="Llama-3-8B", hardware="nvidia-h100-sxm")]}).pools
    assert p.model is not None and p.hardware is not None
    assert p.model.to_shape() == ModelShape(8.03e9, 32, 4096, 8, 128, 2.0)
    assert p.model.max_context == 8192
    assert p.hardware.name == "nvidia-h100-sxm"
    assert p.hardware.to_rates() == HardwareRates(989e12, 3.35e12)
    # named facts claim nothing about the engines' launch (the lever check reads this)
    assert p.model.name == "llama-3-8b" and p.model.model_fields_set == {"name"}


def test_facts_by_name_with_overrides() -> None:
    (p,) = parse_fleet({"pools": [pool(
        model={"name": "meta-llama/Llama-3.1-8B-Instruct", "max_context": 16384},
        hardware={"name": "L4", "kv_cache_bytes": 6e9})]}).pools
    assert p.model is not None and p.hardware is not None
    assert (p.model.layers, p.model.max_context) == (32, 16384)
    assert p.model.model_fields_set == {"name", "max_context"}
    assert (p.hardware.name, p.hardware.peak_flops, p.hardware.kv_cache_bytes) == (
        "nvidia-l4", 121e12, 6e9)


def test_full_facts_are_kept_as_written() -> None:
    hw = {"name": "H100-SXM", "peak_flops": 900e12, "mem_bandwidth": 3e12}
    model = {**FACTS, "name": "llama-3-8b"}  # every field given: a label, not a look-up
    (p,) = parse_fleet({"pools": [pool(model=model, hardware=hw)]}).pools
    assert p.hardware is not None and p.model is not None
    assert (p.hardware.name, p.hardware.peak_flops) == ("H100-SXM", 900e12)  # not the catalogue's
    assert (p.model.name, p.model.layers) == ("llama-3-8b", 2)
    assert "max_context" not in p.model.model_fields_set
    (own,) = parse_fleet({"pools": [pool(model={**FACTS, "name": "my-model"})]}).pools
    assert own.model is not None and own.model.name == "my-model"
    assert p.missing_facts() == ()


def test_named_facts_survive_a_dump_of_the_set_fields() -> None:
    # `ridge render` writes the deployed gateway's fleet file this way
    raw = {"pools": [pool(model={"name": "qwen2.5-7b", "max_context": 16384},
                          hardware="mi300x")]}
    fleet = parse_fleet(raw)
    dumped = fleet.model_dump(mode="json", exclude_unset=True)
    assert dumped["pools"][0]["model"] == {"name": "qwen2.5-7b", "max_context": 16384}
    again = parse_fleet(dumped)
    assert again == fleet
    assert again.pools[0].model is not None
    assert again.pools[0].model.model_fields_set == {"name", "max_context"}


def test_a_pool_without_facts_loads() -> None:
    bare = {k: v for k, v in pool().items() if k not in ("model", "hardware")}
    fleet = parse_fleet({"pools": [bare, pool(name="q", endpoints=["http://h:2"],
                                              hardware=None)]})
    p, q = fleet.pools
    assert (p.model, p.hardware, p.missing_facts()) == (None, None, ("model", "hardware"))
    assert q.model is not None and q.missing_facts() == ("hardware",)


@pytest.mark.parametrize(
    ("over", "field", "problem"),
    [
        ({"model": "llama3-8bb"}, "pools.0.model", "unknown model 'llama3-8bb'; close matches: "),
        ({"hardware": "h100"}, "pools.0.hardware", "unknown accelerator 'h100'; close matches: "),
        ({"hardware": {"name": "tpu", "peak_flops": 1e12}}, "pools.0.hardware",
         "or give both peak_flops and mem_bandwidth"),
        ({"model": {"name": "my-model", "layers": 2}}, "pools.0.model",
         "unknown model 'my-model'"),
        ({"model": {"name": "llama-3-8b", "layers": 0}}, "pools.0.model.layers",
         "greater than 0"),
        ({"model": {"name": "llama-3-8b", "colour": 1}}, "pools.0.model.colour",
         "Extra inputs are not permitted"),
    ],
)
def test_bad_facts_by_name_name_the_field_and_problem(over: dict[str, Any], field: str,
                                                       problem: str) -> None:
    with pytest.raises(FleetConfigError) as info:
        parse_fleet({"pools": [pool(**over)]}, source="fleet.yaml")
    assert f"  {field}: " in str(info.value) and problem in str(info.value), str(info.value)


def test_resolve_is_off_unless_asked_and_dns_takes_http_endpoints_only() -> None:
    assert parse_fleet({"pools": [pool()]}).pools[0].resolve == "none"
    dns = parse_fleet({"pools": [pool(resolve="dns", endpoints=["http://engine:8000"])]})
    assert dns.pools[0].resolve == "dns"
    with pytest.raises(FleetConfigError) as info:
        parse_fleet({"pools": [pool(resolve="dns", endpoints=["https://engine:8443"])]},
                    source="fleet.yaml")
    assert "  pools.0: " in str(info.value)
    assert "resolve: dns connects to each address" in str(info.value)
    with pytest.raises(FleetConfigError, match="pools.0.resolve"):
        parse_fleet({"pools": [pool(resolve="srv")]})


# --- tokenizers: files for exact prompt tokens ----------------------------------------------

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


def test_tokenizer_paths_expand_variables_then_resolve_against_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MODELS_DIR", "/models")
    monkeypatch.delenv("NO_SUCH_DIR", raising=False)
    (tmp_path / "fleet.yaml").write_text(
        "pools:\n"
        "  - {name: p, engine: vllm, models: [a, b, c], endpoints: ['http://h:1']}\n"
        "routing:\n"
        "  features:\n"
        "    tokenizers:\n"
        "      a: ${MODELS_DIR}/a\n"
        "      b: {path: '${NO_SUCH_DIR:-../up}/b', chat_template: t.jinja}\n"
        "      c: $MODELS_DIR/c/tokenizer.json\n")
    got = load_fleet(tmp_path / "fleet.yaml").routing.features.tokenizers
    assert got["a"].path == "/models/a"
    assert got["b"].path == str(tmp_path / "../up/b")
    assert got["b"].chat_template == str(tmp_path / "t.jinja")
    assert got["c"].path == "/models/c/tokenizer.json"


@pytest.mark.parametrize(("path", "env", "expected"), [
    ("$A/x", {"A": "a"}, "a/x"), ("${A}x", {"A": "a"}, "ax"), ("$B/x", {}, "$B/x"),
    ("${B:-d}/x", {}, "d/x"), ("${B:-d}/x", {"B": ""}, "d/x"), ("${B:-d}/x", {"B": "b"}, "b/x"),
    ("plain", {}, "plain"),
])
def test_expand_variables(path: str, env: dict[str, str], expected: str) -> None:
    assert expand_variables(path, env) == expected


def test_adapters_by_name_or_with_path_and_rank() -> None:
    p = parse_fleet({"pools": [pool(adapters=[
        "names-only", {"name": "sql-lora", "path": "/models/sql-lora", "rank": 12}])]}).pools[0]
    assert p.adapter_names() == ("names-only", "sql-lora")
    assert p.adapters[0].path is None and p.adapters[1].path == "/models/sql-lora"
    assert p.max_lora_rank() == 16  # 12 rounded up to a rank vLLM accepts
    assert parse_fleet({"pools": [pool()]}).pools[0].adapters == []
    assert parse_fleet({"pools": [pool(adapters=["a"])]}).pools[0].max_lora_rank() is None


def test_slos_may_name_an_adapter() -> None:
    fleet = parse_fleet({"pools": [pool(adapters=["sql-lora"])],
                         "slos": {"sql-lora": {"ttft_s": 1}}})
    assert "sql-lora" in fleet.slos


@pytest.mark.parametrize(
    ("pools", "problem"),
    [
        ([pool(adapters=["a", {"name": "a"}])], "adapter listed twice"),
        ([pool(adapters=["m"])], "a name of its own"),
        ([pool(adapters=["other"]), pool(name="q", models=["other"], endpoints=["http://h:2"])],
         "also name a base model"),
        ([pool(adapters=[{"name": "a", "rank": 1024}])], "less than or equal to 512"),
        ([pool(adapters=[{"name": "bad name"}])], "pattern"),
    ],
)
def test_bad_adapters_name_the_problem(pools: list[dict[str, Any]], problem: str) -> None:
    with pytest.raises(FleetConfigError, match=problem) as caught:
        parse_fleet({"pools": pools})
    assert "adapters" in str(caught.value) or "pools.0" in str(caught.value)


def test_capacity_levers_and_their_names() -> None:
    levers = {"prefix_caching": True, "kv_cache_dtype": "fp8_e5m2",
              "host_kv_cache": {"size_gb": 64}}
    vllm, sglang = parse_fleet({"pools": [
        pool(levers=levers),
        pool(name="s", engine="sglang", endpoints=["http://h:2"], levers=levers)]}).pools
    assert vllm.levers.kv_dtype_bytes == 1.0 and vllm.levers.host_kv_cache is not None
    assert vllm.levers.host_kv_cache.size_bytes == 64e9
    assert (vllm.host_kv_mechanism(), sglang.host_kv_mechanism()) == ("native", "hicache")
    assert pool_levers(vllm) == {PREFIX_CACHE, FP8_KV_CACHE, HOST_KV_CACHE} <= LEVERS
    plain = parse_fleet({"pools": [pool()]}).pools[0]
    assert plain.levers.kv_cache_dtype == "auto" and plain.levers.kv_dtype_bytes is None
    assert plain.host_kv_mechanism() is None and not pool_levers(plain) & {FP8_KV_CACHE}
    assert {KV_CACHE_DTYPE_BYTES[d] for d in ("fp8", "fp8_e4m3", "fp8_e5m2")} == {1.0}


def test_the_host_link_is_a_hardware_fact_with_a_pcie_default() -> None:
    default = parse_fleet({"pools": [pool()]}).pools[0].hardware
    assert default is not None and default.host_link_bandwidth == 25e9
    named = parse_fleet({"pools": [pool(hardware={"name": "h100-sxm",
                                                  "host_link_bandwidth": 50e9})]}).pools[0]
    assert named.hardware is not None and named.hardware.host_link_bandwidth == 50e9


@pytest.mark.parametrize(("over", "problem"), [
    ({"levers": {"kv_cache_dtype": "fp8_inc"}},
     "pools.0.levers.kv_cache_dtype: Input should be 'auto', 'fp8', 'fp8_e4m3' or 'fp8_e5m2'"),
    ({"levers": {"host_kv_cache": {"size_gb": 8}}}, "it needs prefix_caching: true"),
    ({"levers": {"prefix_caching": True, "host_kv_cache": {"size_gb": 0}}},
     "pools.0.levers.host_kv_cache.size_gb: Input should be greater than 0"),
    ({"levers": {"prefix_caching": True, "host_kv_cache": {"size_gb": 8, "mechanism": "hicache"}}},
     "mechanism 'hicache' is not vllm's: it offers native, lmcache"),
    ({"engine": "sglang", "levers": {"prefix_caching": True,
                                     "host_kv_cache": {"size_gb": 8, "mechanism": "lmcache"}}},
     "mechanism 'lmcache' is not sglang's: it offers hicache"),
    ({"engine": "sglang", "levers": {"prefix_caching": True, "host_kv_cache": {"size_gb": 7.5}}},
     "SGLang's --hicache-size takes whole GB"),
    ({"levers": {"prefix_caching": True, "host_kv_cache": {"size": 8}}},
     "pools.0.levers.host_kv_cache.size: Extra inputs are not permitted"),
])
def test_bad_capacity_levers_name_the_problem(over: dict[str, Any], problem: str) -> None:
    with pytest.raises(FleetConfigError) as exc:
        parse_fleet({"pools": [pool(**over)]})
    assert problem in str(exc.value)


def test_a_prefill_pool_and_its_decode_pool_share_one_kv_cache_dtype() -> None:
    def pair(prefill: str, decode: str) -> dict[str, Any]:
        return {"pools": [
            pool(name="pre", role="prefill", pair="dec", levers={"kv_cache_dtype": prefill}),
            pool(name="dec", role="decode", endpoints=["http://h:2"],
                 levers={"kv_cache_dtype": decode})]}
    assert parse_fleet(pair("fp8", "fp8")).pools[0].levers.kv_cache_dtype == "fp8"
    with pytest.raises(FleetConfigError, match="share one kv_cache_dtype"):
        parse_fleet(pair("fp8", "auto"))
    with pytest.raises(FleetConfigError, match="share one kv_cache_dtype"):
        parse_fleet(pair("fp8", "fp8_e4m3"))  # vLLM's NIXL hand-off compares the names


CACHED = {"prefix_caching": True}


def test_kv_event_streams_on_each_endpoints_host() -> None:
    p = parse_fleet({"pools": [pool(
        endpoints=["http://a:8000", "http://[fd00::1]:8000"], levers=CACHED,
        kv_events={"port": 5557, "replay_port": 5558, "topic": "kv"})]}).pools[0]
    assert p.kv_event_sources() == {
        "http://a:8000": KvEventSource("tcp://a:5557", "tcp://a:5558", "kv"),
        "http://[fd00::1]:8000": KvEventSource("tcp://[fd00::1]:5557", "tcp://[fd00::1]:5558",
                                               "kv"),
    }
    assert p.kv_events is not None and p.kv_events.ports() == {"kv-events": 5557,
                                                               "kv-replay": 5558}
    plain = parse_fleet({"pools": [pool(levers=CACHED, kv_events={"port": 5557})]}).pools[0]
    assert plain.kv_event_sources() == {"http://h:1": KvEventSource("tcp://h:5557", None, "")}
    assert parse_fleet({"pools": [pool()]}).pools[0].kv_event_sources() == {}


def test_kv_event_addresses_name_engines_that_share_a_host() -> None:
    urls = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    listed = {"port": 5557, "addresses": ["tcp://127.0.0.1:5601", "tcp://127.0.0.1:5602"]}
    p = parse_fleet({"pools": [pool(endpoints=urls, levers=CACHED, kv_events={
        **listed, "replay_addresses": ["tcp://127.0.0.1:5701", "tcp://127.0.0.1:5702"]})]}
                    ).pools[0]
    assert p.kv_event_sources()[urls[1]] == KvEventSource("tcp://127.0.0.1:5602",
                                                          "tcp://127.0.0.1:5702", "")
    assert list(p.kv_event_sources([urls[1]])) == [urls[1]]
    with pytest.raises(ValueError, match="not one of the pool's endpoints"):
        p.kv_event_sources(["http://127.0.0.1:9999"])
    # replay_port with listed addresses: each address's host on that port
    p = parse_fleet({"pools": [pool(endpoints=["http://a:1", "http://b:1"], levers=CACHED,
                                    kv_events={"port": 5557, "replay_port": 5558,
                                               "addresses": ["tcp://x:1", "tcp://[::1]:2"]})]}
                    ).pools[0]
    assert [s.replay for s in p.kv_event_sources().values()] == ["tcp://x:5558",
                                                                  "tcp://[::1]:5558"]


def test_a_dns_pool_takes_kv_events_from_each_resolved_address() -> None:
    p = parse_fleet({"pools": [pool(resolve="dns", endpoints=["http://engine:8000"],
                                    levers=CACHED, kv_events={"port": 5557})]}).pools[0]
    resolved = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert p.kv_event_sources(resolved) == {
        u: KvEventSource(f"tcp://10.0.0.{i}:5557", None, "") for i, u in enumerate(resolved, 1)}


def test_an_sglang_pool_takes_kv_events_too() -> None:
    """Both engines' formats are decoded (backends.kv_events.wire.WIRE_FORMATS)."""
    assert {Engine.VLLM, Engine.SGLANG} == KV_EVENT_ENGINES
    p = parse_fleet({"pools": [pool(engine="sglang", levers=CACHED,
                                    kv_events={"port": 5557, "replay_port": 5558})]}).pools[0]
    assert p.kv_event_sources() == {"http://h:1": KvEventSource("tcp://h:5557", "tcp://h:5558",
                                                                "")}
    with pytest.raises(FleetConfigError, match="it needs levers.prefix_caching: true"):
        parse_fleet({"pools": [pool(engine="sglang", kv_events={"port": 5557})]})


@pytest.mark.parametrize(("over", "problem"), [
    ({"kv_events": {"port": 5557}}, "it needs levers.prefix_caching: true"),
    ({"levers": CACHED, "kv_events": {"port": 5557, "replay_port": 5557}},
     "replay_port must differ from port"),
    ({"levers": CACHED, "kv_events": {"port": 70000}},
     "pools.0.kv_events.port: Input should be less than or equal to 65535"),
    ({"levers": CACHED, "kv_events": {"port": 5557, "replay_addresses": ["tcp://h:1"]}},
     "replay_addresses go with addresses"),
    ({"levers": CACHED, "kv_events": {"port": 5557, "addresses": ["http://h:1"]}},
     "pools.0.kv_events.addresses.0: String should match pattern"),
    ({"levers": CACHED, "kv_events": {"port": 5557, "addresses": ["tcp://*:1"]}},
     "String should match pattern"),
    ({"levers": CACHED, "kv_events": {"port": 5557, "addresses": ["tcp://h:70000"]}},
     "addresses: tcp://h:70000 has no port from 1 to 65535"),
    ({"levers": CACHED, "kv_events": {"port": 5557, "addresses": ["tcp://a:1", "tcp://b:1"]}},
     "kv_events.addresses: one per endpoint (1), not 2"),
    ({"levers": CACHED, "endpoints": ["http://a:1", "http://b:1"],
      "kv_events": {"port": 5557, "addresses": ["tcp://a:1", "tcp://a:1"]}},
     "addresses: an address listed twice"),
    ({"levers": CACHED, "resolve": "dns", "kv_events": {"port": 5557, "addresses": ["tcp://a:1"]}},
     "a resolve: dns pool's engines are the addresses its names resolve to"),
    ({"levers": CACHED, "endpoints": ["http://a:1", "http://a:2"], "kv_events": {"port": 5557}},
     "endpoints share the host a"),
    ({"levers": CACHED, "endpoints": ["http://a:5557"], "kv_events": {"port": 5557}},
     "port 5557 is also an endpoint's HTTP port"),
    ({"levers": CACHED, "kv_events": {"port": 5557, "hwm": 10}},
     "pools.0.kv_events.hwm: Extra inputs are not permitted"),
])
def test_bad_kv_events_name_the_problem(over: dict[str, Any], problem: str) -> None:
    with pytest.raises(FleetConfigError) as exc:
        parse_fleet({"pools": [pool(**over)]})
    assert problem in str(exc.value)
