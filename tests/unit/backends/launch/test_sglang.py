"""backends.launch.sglang: a pool's levers rendered as SGLang flags, both ways; every flag it
can emit is in the table of SGLang's documented server arguments (SGLang cannot run here)."""

from __future__ import annotations

import json
from itertools import product
from typing import Any

import pytest

from backends.launch.args import Arg, EnvRef, LaunchError, flag_name
from backends.launch.sglang import (
    ALGORITHMS,
    DOCUMENTED,
    DOCUMENTED_ALGORITHMS,
    DOCUMENTED_KV_CACHE_DTYPES,
    FLAGS,
    KV_CACHE_DTYPES,
    LAUNCHER,
    LORA_FLAGS,
    PARALLEL_FLAGS,
    SGLangSettings,
    sglang_args,
)
from backends.upstream.pd import SGLANG_BOOTSTRAP_PORT
from config.pools import Pool

FACTS = {"params": 8e9, "layers": 32, "hidden_size": 4096, "kv_heads": 8, "head_dim": 128,
         "dtype_bytes": 2}
HARDWARE = {"peak_flops": 9.89e14, "mem_bandwidth": 3.35e12}


def pool(levers: dict[str, Any], **more: Any) -> Pool:
    return Pool.model_validate({
        "name": "p", "engine": "sglang", "models": ["llama", "llama-alias"],
        "endpoints": ["http://127.0.0.1:30000"], "levers": levers, "model": FACTS,
        "hardware": HARDWARE, **more,
    })  # fmt: skip


def after(args: list[Arg], flag: str) -> list[Arg]:
    start = args.index(flag) + 1
    end = next((i for i in range(start, len(args))
                if isinstance(args[i], str) and str(args[i]).startswith("--")), len(args))
    return args[start:end]


def spec(method: str, k: int = 3, draft: str | None = "d/draft") -> dict[str, Any]:
    return {"speculative": {"method": method, "num_draft_tokens": k, "draft_model": draft}}


def test_names_address_and_metrics() -> None:
    args = sglang_args(pool({}), 30001, "org/llama")
    assert after(args, "--host") == ["127.0.0.1"] and after(args, "--port") == ["30001"]
    assert after(args, "--model-path") == ["org/llama"]
    assert after(args, "--served-model-name") == ["llama"]  # SGLang takes one name
    assert "--enable-metrics" in args
    assert "--dtype" not in args and "--context-length" not in args


def test_settings_can_be_set() -> None:
    args = sglang_args(pool({}), 1, "m", SGLangSettings(dtype="bfloat16", context_length=8192))
    assert after(args, "--dtype") == ["bfloat16"] and after(args, "--context-length") == ["8192"]


def test_a_pool_without_levers_switches_them_off() -> None:
    args = sglang_args(pool({}), 1, "m")
    assert "--disable-radix-cache" in args
    assert after(args, "--chunked-prefill-size") == ["-1"]
    assert not [a for a in args if str(a).startswith("--speculative")]
    assert "--disaggregation-mode" not in args


def test_radix_cache_and_chunked_prefill_on() -> None:
    args = sglang_args(pool({"prefix_caching": True, "chunked_prefill": {"token_budget": 512}}),
                       1, "m")
    assert "--disable-radix-cache" not in args
    assert after(args, "--chunked-prefill-size") == ["512"]


def test_ngram_is_a_chain_of_k_drafts() -> None:
    args = sglang_args(pool(spec("ngram", 4, None)), 1, "m")
    assert after(args, "--speculative-algorithm") == ["NGRAM"]
    assert after(args, "--speculative-num-draft-tokens") == ["5"]
    assert after(args, "--speculative-ngram-max-bfs-breadth") == ["1"]
    assert "--speculative-draft-model-path" not in args


@pytest.mark.parametrize(("method", "algorithm"),
                         [("eagle", "EAGLE"), ("eagle3", "EAGLE3"), ("draft_model", "STANDALONE")])
def test_draft_model_algorithms_set_all_three_tree_sizes(method: str, algorithm: str) -> None:
    args = sglang_args(pool(spec(method, 3)), 1, "m")
    assert after(args, "--speculative-algorithm") == [algorithm]
    assert after(args, "--speculative-draft-model-path") == ["d/draft"]
    assert after(args, "--speculative-num-steps") == ["3"]
    assert after(args, "--speculative-eagle-topk") == ["1"]
    assert after(args, "--speculative-num-draft-tokens") == ["4"]
    with pytest.raises(LaunchError, match="needs a draft_model"):
        sglang_args(pool(spec(method, 3, None)), 1, "m")


def test_mtp_runs_as_eagle_without_a_draft_checkpoint() -> None:
    args = sglang_args(pool(spec("mtp", 1, None)), 1, "m")
    assert after(args, "--speculative-algorithm") == ["EAGLE"]
    assert "--speculative-draft-model-path" not in args
    assert after(args, "--speculative-num-draft-tokens") == ["2"]


def test_medusa_has_no_sglang_algorithm() -> None:
    with pytest.raises(LaunchError, match="no SGLang algorithm"):
        sglang_args(pool(spec("medusa")), 1, "m")


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_disaggregated_pools(role: str) -> None:
    more = {"pair": "d"} if role == "prefill" else {}
    args = sglang_args(pool({}, role=role, **more), 1, "m")
    assert after(args, "--disaggregation-mode") == [role]
    assert after(args, "--disaggregation-transfer-backend") == ["mooncake"]
    assert after(args, "--disaggregation-bootstrap-port") == [str(SGLANG_BOOTSTRAP_PORT)]
    nixl = sglang_args(pool({}, role=role, **more), 1, "m", SGLangSettings(transfer_backend="nixl"))
    assert after(nixl, "--disaggregation-transfer-backend") == ["nixl"]
    with pytest.raises(LaunchError, match="unknown SGLang transfer backend"):
        sglang_args(pool({}, role=role, **more), 1, "m", SGLangSettings(transfer_backend="tcp"))


def test_api_key_by_reference_and_engine_args_last() -> None:
    extra = ["--tool-call-parser", "llama3", "--tp-size", "2"]
    p = pool({}, api_key_env="SGL_KEY", engine_args=extra)
    args = sglang_args(p, 1, "m")
    assert after(args, "--api-key") == [EnvRef("SGL_KEY")]
    assert args[-4:] == extra
    assert LAUNCHER.gpus(p) == 2


@pytest.mark.parametrize("arg", ["--disable-radix-cache", "--chunked-prefill-size=1",
                                 "--speculative-algo", "--model", "--served-model-name"])
def test_engine_args_may_not_contradict_the_levers(arg: str) -> None:
    with pytest.raises(LaunchError, match="engine_args may not set"):
        sglang_args(pool({}, engine_args=[arg, "x"]), 1, "m")


LEVERS = [{}, {"prefix_caching": True, "chunked_prefill": {"token_budget": 64}},
          {"chunked_prefill": {"enabled": False}},
          *(spec(m) for m in ALGORITHMS),
          {"prefix_caching": True, "kv_cache_dtype": "fp8", "host_kv_cache": {"size_gb": 64}}]


@pytest.mark.parametrize(("levers", "role"), product(LEVERS, ["mixed", "prefill", "decode"]))
def test_every_emitted_flag_is_documented(levers: dict[str, Any], role: str) -> None:
    more = {"pair": "d"} if role == "prefill" else {}
    p = pool(levers, role=role, api_key_env="K", **more)
    for args in (sglang_args(p, 1, "m", SGLangSettings(dtype="auto", context_length=1)),
                 LAUNCHER.args(p, "0.0.0.0", LAUNCHER.port, "m")):
        emitted = {f for a in args if isinstance(a, str) and (f := flag_name(a))}
        assert emitted <= set(DOCUMENTED), emitted - set(DOCUMENTED)


def test_the_tables_agree_with_the_documented_arguments() -> None:
    assert set(FLAGS.values()) <= set(DOCUMENTED)
    assert set(ALGORITHMS.values()) <= DOCUMENTED_ALGORITHMS
    parallel = {f for flags in PARALLEL_FLAGS for f in flags} - {"--tp"}  # the docs' shorthand
    assert parallel <= set(DOCUMENTED)
    assert all(flag.startswith("--") and DOCUMENTED[flag] for flag in DOCUMENTED)


def test_adapters_render_lora_flags_all_documented() -> None:
    adapters = [{"name": "sql-lora", "path": "/models/sql-lora", "rank": 12}, "runtime-only"]
    args = sglang_args(pool({}, adapters=adapters), 1, "m")
    assert "--enable-lora" in args
    assert after(args, "--lora-paths") == ["sql-lora=/models/sql-lora"]
    assert after(args, "--max-lora-rank") == ["12"]
    assert set(LORA_FLAGS.values()) <= set(DOCUMENTED)
    emitted = {f for a in args if isinstance(a, str) and (f := flag_name(a))}
    assert emitted <= set(DOCUMENTED)
    assert "--enable-lora" not in sglang_args(pool({}), 1, "m")
    assert "--enable-lora" in sglang_args(pool({}, engine_args=["--enable-lora"]), 1, "m")
    with pytest.raises(LaunchError, match="--lora-paths"):
        sglang_args(pool({}, adapters=adapters, engine_args=["--lora-paths", "y=z"]), 1, "m")


def test_capacity_levers_render_as_sglang_names_them() -> None:
    levers = {"prefix_caching": True, "kv_cache_dtype": "fp8", "host_kv_cache": {"size_gb": 64}}
    args = sglang_args(pool(levers), 1, "m")
    assert after(args, "--kv-cache-dtype") == ["fp8_e4m3"]  # SGLang has no plain fp8
    assert after(args, "--enable-hierarchical-cache") == []
    assert after(args, "--hicache-size") == ["64"]  # GB, as the fleet file's size_gb
    assert "--hicache-ratio" not in args  # the size overrides it
    e5m2 = sglang_args(pool({"kv_cache_dtype": "fp8_e5m2"}), 1, "m")
    assert after(e5m2, "--kv-cache-dtype") == ["fp8_e5m2"]
    assert "--enable-hierarchical-cache" not in e5m2
    plain = sglang_args(pool({}), 1, "m")
    assert not {"--kv-cache-dtype", "--enable-hierarchical-cache"} & set(map(str, plain))


def test_every_kv_dtype_is_a_documented_choice() -> None:
    assert {d for d in KV_CACHE_DTYPES.values() if d is not None} <= DOCUMENTED_KV_CACHE_DTYPES


@pytest.mark.parametrize("arg", ["--kv-cache-dtype", "--enable-hierarchical-cache",
                                 "--hicache-size", "--hicache-ratio=4"])
def test_engine_args_may_not_set_a_capacity_lever(arg: str) -> None:
    with pytest.raises(LaunchError, match="engine_args may not set"):
        sglang_args(pool({}, engine_args=[arg, "x"]), 1, "m")
    # tuning the hierarchical cache stays open
    tuned = pool({"prefix_caching": True, "host_kv_cache": {"size_gb": 64}},
                 engine_args=["--hicache-write-policy", "write_back"])
    assert sglang_args(tuned, 1, "m")[-2:] == ["--hicache-write-policy", "write_back"]


EVENTS = {"prefix_caching": True}
SGLANG_KV_EVENTS_CONFIG = frozenset({"publisher", "endpoint", "bind", "replay_endpoint",
                                     "buffer_steps", "hwm", "max_queue_size", "topic", "format"})
"""The fields of SGLang 0.5.23's ``KVEventsConfig`` (sglang/srt/disaggregation/kv_events.py), the
pydantic model ``--kv-events-config``'s JSON is validated into."""


def test_kv_events_render_sglangs_zmq_publisher_on_every_address() -> None:
    p = pool(EVENTS, kv_events={"port": 5557, "replay_port": 5558, "topic": "kv"})
    for args in (sglang_args(p, 1, "m"), LAUNCHER.args(p, "0.0.0.0", 30000, "m")):
        (value,) = after(args, "--kv-events-config")
        config = json.loads(str(value))
        assert config == {"publisher": "zmq", "endpoint": "tcp://*:5557",
                          "replay_endpoint": "tcp://*:5558", "topic": "kv"}
        assert set(config) <= SGLANG_KV_EVENTS_CONFIG
    (value,) = after(sglang_args(pool(EVENTS, kv_events={"port": 6000}), 1, "m"),
                     "--kv-events-config")
    assert json.loads(str(value)) == {"publisher": "zmq", "endpoint": "tcp://*:6000", "topic": ""}
    assert "--kv-events-config" not in sglang_args(pool(EVENTS), 1, "m")
    assert FLAGS["kv_events"] in DOCUMENTED


def test_an_engine_sharing_a_host_binds_its_own_event_ports() -> None:
    p = pool(EVENTS, kv_events={"port": 5557, "replay_port": 5558})
    args = sglang_args(p, 1, "m", SGLangSettings(kv_events_ports=(5602, None)))
    assert json.loads(str(after(args, "--kv-events-config")[0])) == {
        "publisher": "zmq", "endpoint": "tcp://*:5602", "topic": ""}


@pytest.mark.parametrize("extra", [["--dp-size", "2"], ["--data-parallel-size=4"]])
def test_kv_events_refuse_data_parallel_ranks_behind_one_endpoint(extra: list[str]) -> None:
    with pytest.raises(LaunchError, match="each rank publishes its KV events"):
        sglang_args(pool(EVENTS, kv_events={"port": 5557}, engine_args=extra), 1, "m")
    single = pool(EVENTS, kv_events={"port": 5557}, engine_args=["--dp-size", "1"])
    assert "--kv-events-config" in sglang_args(single, 1, "m")


def test_engine_args_may_not_set_kv_events() -> None:
    with pytest.raises(LaunchError, match="--kv-events-config"):
        sglang_args(pool({}, engine_args=["--kv-events-config", "{}"]), 1, "m")
