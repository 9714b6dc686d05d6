"""backends.vllm_launch: a pool's levers rendered as vLLM flags, both ways, and its environment."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.fleet_file import Pool, Speculative
from backends.vllm_launch import (
    LaunchSettings,
    main,
    speculative_config,
    vllm_args,
    vllm_command,
    vllm_env,
)

FACTS = {"params": 1.35e8, "layers": 30, "hidden_size": 576, "kv_heads": 3, "head_dim": 64,
         "dtype_bytes": 4}
HARDWARE = {"peak_flops": 2e11, "mem_bandwidth": 2e10}


def pool(levers: dict[str, Any], models: list[str] | None = None) -> Pool:
    return Pool.model_validate({
        "name": "p", "engine": "vllm", "models": models or ["m"],
        "endpoints": ["http://127.0.0.1:8001"], "levers": levers, "model": FACTS,
        "hardware": HARDWARE,
    })  # fmt: skip


def after(args: list[str], flag: str) -> list[str]:
    """The values following ``flag`` up to the next flag."""
    start = args.index(flag) + 1
    end = next((i for i in range(start, len(args)) if args[i].startswith("--")), len(args))
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
