"""Render a pool's levers into a vLLM OpenAI-server command line and its environment.

A pool in the fleet file says which levers its engines were launched with; this module turns
that declaration into the flags that launch such an engine, so the fleet file and the engines
cannot drift apart. Flag names are data (:data:`FLAGS`, :data:`SPECULATIVE_EXTRAS`,
:data:`LORA_FLAGS`), checked against vLLM's ``--help``: a capture in ``tests/data`` (unit tier)
and the live CPU build (real-engine tier).

Invariants: every lever is rendered both ways (a lever the pool does not declare is switched
off explicitly, since vLLM turns some on by default); the API key is a reference
(:mod:`backends.launch.args`); ``engine_args`` come last, verbatim, and may not set a flag of
:data:`FLAGS`; a P/D pool with a host tier, or ``kv_events`` with data parallelism, is refused.
:class:`LaunchSettings` holds what is not a lever, :func:`vllm_env` the environment.

``python -m backends.launch.vllm FLEET.yaml POOL --port P --model-dir DIR`` prints one pool's
command. See docs/backends.md#vllm for every rule, and docs/deploy.md for the table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from backends.launch.args import (
    Arg,
    Launcher,
    LaunchError,
    api_key_args,
    extra_args,
    flags_set,
    kv_events_args,
    resolve,
    shell_join,
)
from config.engines import Role
from config.fleet import load_fleet
from config.kv_events import KvEvents, address_port
from config.levers import HostKvCache, Speculative
from config.pools import Pool

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
GIB = float(1 << 30)  # bytes per GiB, the unit of --kv-offloading-size
DEFAULT_PORT = 8000  # vLLM's own --port default

FLAGS: Mapping[str, str] = MappingProxyType(
    {
        "host": "--host",
        "port": "--port",
        "model": "--model",
        "served_model_name": "--served-model-name",
        "dtype": "--dtype",
        "max_model_len": "--max-model-len",
        "enforce_eager": "--enforce-eager",
        "prefix_caching_on": "--enable-prefix-caching",
        "prefix_caching_off": "--no-enable-prefix-caching",
        "cache_report": "--enable-prompt-tokens-details",
        "chunked_prefill_on": "--enable-chunked-prefill",
        "chunked_prefill_off": "--no-enable-chunked-prefill",
        "chunk_tokens": "--max-num-batched-tokens",
        "speculative": "--speculative-config",
        "kv_transfer": "--kv-transfer-config",
        "api_key": "--api-key",
        "kv_cache_dtype": "--kv-cache-dtype",
        "host_kv_size": "--kv-offloading-size",
        "host_kv_backend": "--kv-offloading-backend",
        "kv_events": "--kv-events-config",
    }
)
"""Lever or setting → vLLM flag (vLLM 0.32 ``python -m vllm.entrypoints.openai.api_server``)."""

LORA_FLAGS: Mapping[str, str] = MappingProxyType(
    {
        "lora_on": "--enable-lora",
        "lora_modules": "--lora-modules",
        "lora_rank": "--max-lora-rank",
    }
)
"""The pool's LoRA adapters → vLLM flags (rendered only for a pool with adapters)."""

ALIASES: frozenset[str] = frozenset({"-sc"})
"""Short spellings of flags in :data:`FLAGS` (``-sc`` = ``--speculative-config``)."""

NGRAM_LOOKUP: Mapping[str, int] = MappingProxyType({"prompt_lookup_max": 4, "prompt_lookup_min": 2})
"""n-gram proposer window, in tokens: the longest and shortest suffix matched in the context."""

SPECULATIVE_EXTRAS: Mapping[str, Mapping[str, int]] = MappingProxyType({"ngram": NGRAM_LOOKUP})
"""Method → extra ``--speculative-config`` keys; methods absent here need none."""

NEEDS_DRAFT_MODEL: frozenset[str] = frozenset({"eagle", "eagle3", "medusa", "draft_model"})
"""Methods whose ``--speculative-config`` must name a draft checkpoint (``model``)."""

KV_TRANSFER: Mapping[str, str] = MappingProxyType(
    {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
)
"""``--kv-transfer-config`` of a prefill or decode pool (vLLM docs, NixlConnector usage guide:
both sides run the NIXL connector as ``kv_both``)."""

DATA_PARALLEL_FLAGS: frozenset[str] = frozenset({"--data-parallel-size", "-dp"})
"""Spellings of the data-parallel size (one scheduler, and one KV event stream, per rank)."""

PARALLEL_FLAGS: tuple[frozenset[str], ...] = (
    frozenset({"--tensor-parallel-size", "-tp"}),
    frozenset({"--pipeline-parallel-size", "-pp"}),
    DATA_PARALLEL_FLAGS,
)
"""Flags of ``engine_args`` whose values multiply into the GPUs one engine needs."""

SIDE_PORTS: Mapping[Role, Mapping[str, int]] = MappingProxyType({
    Role.PREFILL: {"nixl": 5600},  # VLLM_NIXL_SIDE_CHANNEL_PORT's default
    Role.DECODE: {"nixl": 5600},
})  # fmt: skip
"""Ports an engine listens on besides its HTTP port, by pool role."""

ENV_KEYS: Mapping[str, str] = MappingProxyType(
    {
        "offline": "HF_HUB_OFFLINE",
        "kv_cache_gib": "VLLM_CPU_KVCACHE_SPACE",
        "cpu_bind": "VLLM_CPU_OMP_THREADS_BIND",
    }
)
"""Environment variables the CPU build of vLLM reads at start-up."""


@dataclass(frozen=True, slots=True)
class LaunchSettings:
    """Settings that are not levers. ``max_model_len`` is in tokens (prompt + output); a None
    setting is left to vLLM (no flag). ``kv_events_ports``: the (publish, replay) ports this
    one engine binds for its KV events, for engines sharing a host whose addresses the fleet
    file lists (:func:`engine_event_ports`); None = the pool's ``port`` and ``replay_port``."""

    host: str = "127.0.0.1"
    dtype: str | None = "float32"
    enforce_eager: bool = True
    max_model_len: int | None = 2048
    kv_events_ports: tuple[int, int | None] | None = None


DEPLOY_SETTINGS = LaunchSettings(host="0.0.0.0", dtype=None, enforce_eager=False,
                                 max_model_len=None)
"""A GPU deployment: every address, and vLLM's own choice of dtype, graphs and context."""


def vllm_args(
    pool: Pool, port: int, model_dir: str, settings: LaunchSettings = LaunchSettings()
) -> list[Arg]:
    """The flags (after ``python -m vllm.entrypoints.openai.api_server``) for one pool engine."""
    args: list[Arg] = [
        FLAGS["host"], settings.host,
        FLAGS["port"], str(port),
        FLAGS["model"], model_dir,
        FLAGS["served_model_name"], *pool.models,
    ]  # fmt: skip
    if settings.dtype is not None:
        args += [FLAGS["dtype"], settings.dtype]
    if settings.max_model_len is not None:
        args += [FLAGS["max_model_len"], str(settings.max_model_len)]
    if settings.enforce_eager:
        args.append(FLAGS["enforce_eager"])
    lora = lora_args(pool)
    args += lever_args(pool) + pd_args(pool) + kv_events_args(
        pool, FLAGS["kv_events"], DATA_PARALLEL_FLAGS, kv_events_config, settings.kv_events_ports)
    args += lora
    args += api_key_args(pool, FLAGS["api_key"])
    rendered = flags_set(lora, set(LORA_FLAGS.values()))
    return args + extra_args(pool, set(FLAGS.values()) | ALIASES | rendered)


def lora_args(pool: Pool) -> list[Arg]:
    """The LoRA flags of a pool with adapters (module docstring); nothing without."""
    if not pool.adapters:
        return []
    args: list[Arg] = [LORA_FLAGS["lora_on"]]
    modules = [lora_module(a.name, a.path) for a in pool.adapters if a.path is not None]
    if modules:
        args += [LORA_FLAGS["lora_modules"], *modules]
    rank = pool.max_lora_rank()
    if rank is not None:
        args += [LORA_FLAGS["lora_rank"], str(rank)]
    return args


def lora_module(name: str, path: str) -> str:
    """One ``--lora-modules`` value: ``NAME=PATH``, or vLLM's JSON form when ``path`` holds a
    comma (vLLM reads an item with a comma as JSON)."""
    if "," in path:
        return json.dumps({"name": name, "path": path})
    return f"{name}={path}"


def lever_args(pool: Pool) -> list[Arg]:
    """The flags that set the pool's levers, each lever explicitly on or off."""
    levers = pool.levers
    args: list[Arg] = [
        FLAGS["prefix_caching_on" if levers.prefix_caching else "prefix_caching_off"]
    ]
    if levers.prefix_caching:  # usage.prompt_tokens_details.cached_tokens: the lost-reuse figure
        args.append(FLAGS["cache_report"])
    if levers.chunked_prefill is not None and levers.chunked_prefill.enabled:
        budget = str(levers.chunked_prefill.token_budget)
        args += [FLAGS["chunked_prefill_on"], FLAGS["chunk_tokens"], budget]
    else:
        args.append(FLAGS["chunked_prefill_off"])
    if levers.speculative is not None:
        args += [FLAGS["speculative"], json.dumps(speculative_config(levers.speculative))]
    return args + capacity_args(pool)


def capacity_args(pool: Pool) -> list[Arg]:
    """The capacity levers' flags: KV dtype and host tier (module docstring); none when off."""
    levers = pool.levers
    args: list[Arg] = []
    if levers.kv_cache_dtype != "auto":
        args += [FLAGS["kv_cache_dtype"], levers.kv_cache_dtype]
    tier, mechanism = levers.host_kv_cache, pool.host_kv_mechanism()
    if tier is None or mechanism is None:
        return args
    if pool.role is not Role.MIXED:
        raise LaunchError(f"pool {pool.name!r}: vLLM's KV offloading installs its own KV "
                          "connector, replacing the NIXL one a prefill or decode pool needs; "
                          "give the host tier to a mixed pool")
    return args + [FLAGS["host_kv_size"], offloading_gib(tier),
                   FLAGS["host_kv_backend"], mechanism]


def offloading_gib(tier: HostKvCache) -> str:
    """``--kv-offloading-size`` [GiB] = size_gb · 1e9 / 2**30, exactly as a float."""
    return repr(tier.size_bytes / GIB)


def pd_args(pool: Pool) -> list[Arg]:
    """``--kv-transfer-config`` for a prefill or decode pool; nothing for a mixed one."""
    if pool.role is Role.MIXED:
        return []
    return [FLAGS["kv_transfer"], json.dumps(dict(KV_TRANSFER))]


def engine_event_ports(pool: Pool, url: str) -> tuple[int, int | None] | None:
    """The (publish, replay) ports the engine of endpoint ``url`` binds, from the addresses the
    fleet file lists for it; None when it lists none (every engine binds the pool's ports)."""
    events = pool.kv_events
    if events is None or events.addresses is None:
        return None
    source = pool.kv_event_sources([url])[url]
    replay = None if source.replay is None else address_port(source.replay)
    return address_port(source.publish), replay


def kv_events_config(events: KvEvents) -> dict[str, Any]:
    """The ``--kv-events-config`` object: vLLM's ZMQ publisher bound on every address."""
    config: dict[str, Any] = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{events.port}",
    }
    if events.replay_port is not None:
        config["replay_endpoint"] = f"tcp://*:{events.replay_port}"
    config["topic"] = events.topic
    return config


def speculative_config(spec: Speculative) -> dict[str, Any]:
    """The ``--speculative-config`` object for a pool's speculative lever."""
    config: dict[str, Any] = {
        "method": spec.method,
        "num_speculative_tokens": spec.num_draft_tokens,
    }
    if spec.method in NEEDS_DRAFT_MODEL:
        if spec.draft_model is None:
            raise LaunchError(f"speculative method {spec.method!r} needs a draft_model")
        config["model"] = spec.draft_model
    config.update(SPECULATIVE_EXTRAS.get(spec.method, {}))
    return config


def vllm_command(python: str, pool: Pool, port: int, model_dir: str,
                 env: Mapping[str, str] | None = None,
                 settings: LaunchSettings = LaunchSettings()) -> list[str]:
    """The whole argv of a local process: ``python -m vllm.entrypoints.openai.api_server`` and
    :func:`vllm_args`, references (the API key) read from ``env`` (default: this process's)."""
    argv = [python, "-m", SERVER_MODULE, *vllm_args(pool, port, model_dir, settings)]
    return resolve(argv, os.environ if env is None else env)


def deploy_args(pool: Pool, host: str, port: int, checkpoint: str) -> list[Arg]:
    """The flags of one engine of a deployment (:data:`DEPLOY_SETTINGS` on ``host``)."""
    return vllm_args(pool, port, checkpoint, replace(DEPLOY_SETTINGS, host=host))


LAUNCHER = Launcher(module=SERVER_MODULE, port=DEFAULT_PORT, args=deploy_args,
                    parallel=PARALLEL_FLAGS, side_ports=SIDE_PORTS)
"""vLLM's launch recipe for deployments (``ridge render``)."""


def vllm_env(
    base: Mapping[str, str], kv_cache_gib: int = 1, cpu_bind: str | None = None
) -> dict[str, str]:
    """``base`` plus the variables a CPU vLLM needs; ``cpu_bind`` like ``"0"`` or ``"0-1"``."""
    env = dict(base)
    env[ENV_KEYS["offline"]] = "1"
    env[ENV_KEYS["kv_cache_gib"]] = str(kv_cache_gib)
    if cpu_bind is not None:
        env[ENV_KEYS["cpu_bind"]] = cpu_bind
    return env


def main(argv: Sequence[str] | None = None) -> int:
    """Print the launch command of one pool of a fleet file (the API key as ``"$VAR"``)."""
    parser = argparse.ArgumentParser(description="Print the vLLM command for a fleet pool.")
    parser.add_argument("fleet", help="fleet YAML file")
    parser.add_argument("pool", help="pool name")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model-dir", required=True, help="Hugging Face model folder")
    parser.add_argument("--python", default="python", help="interpreter of the vLLM venv")
    ns = parser.parse_args(argv)
    try:
        pool = load_fleet(ns.fleet).pool(ns.pool)
    except KeyError:
        parser.error(f"{ns.fleet}: no pool named {ns.pool!r}")
    try:
        args = vllm_args(pool, ns.port, ns.model_dir)
    except LaunchError as exc:
        parser.error(str(exc))
    print(shell_join([ns.python, "-m", SERVER_MODULE, *args]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
