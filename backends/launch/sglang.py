"""Render a pool's levers into an SGLang server command line (``python -m sglang.launch_server``).

The SGLang counterpart of :mod:`backends.launch.vllm`: the fleet file says which levers a pool's
engines run with, and this module writes the flags that launch such an engine. SGLang cannot
run on the machines this project is tested on (it needs CUDA), so every flag this module can
emit is looked up in :data:`DOCUMENTED`, the table of SGLang's documented server arguments it
relies on (a unit test checks every rendered command against it).

Invariants, as for vLLM: every lever is rendered both ways; K drafted tokens are a chain
(``--speculative-num-draft-tokens K+1``); the P/D bootstrap port is the one the hand-off names
(:data:`backends.upstream.pd.SGLANG_BOOTSTRAP_PORT`); ``--enable-metrics`` is always on; the
API key is a reference; ``engine_args`` come last and may not set a flag of :data:`FLAGS`.
:class:`SGLangSettings` holds what is not a lever. See docs/backends.md#sglang for every rule
and the SGLang sources each one follows.
"""

from __future__ import annotations

from collections.abc import Mapping
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
)
from backends.upstream.pd import SGLANG_BOOTSTRAP_PORT
from config.engines import Role
from config.kv_events import KvEvents
from config.levers import Speculative
from config.pools import Pool

SERVER_MODULE = "sglang.launch_server"
DEFAULT_PORT = 30000  # SGLang's own --port default

DOCUMENTED: Mapping[str, str] = MappingProxyType({
    "--model-path": "Model and tokenizer: the model weights, a local folder or a Hugging Face id",
    "--context-length": "Model and tokenizer: the model's maximum context length",
    "--host": "HTTP server: the host of the HTTP server",
    "--port": "HTTP server: the port of the HTTP server",
    "--dtype": "Quantization and data type: weights and activations",
    "--chunked-prefill-size": "Memory and scheduling: tokens per prefill chunk; -1 disables",
    "--tensor-parallel-size": "Runtime options: tensor parallelism size (alias --tp-size)",
    "--tp-size": "Runtime options: alias of --tensor-parallel-size",
    "--pipeline-parallel-size": "Runtime options: pipeline parallelism size (alias --pp-size)",
    "--pp-size": "Runtime options: alias of --pipeline-parallel-size",
    "--data-parallel-size": "Data parallelism: data parallelism size (alias --dp-size)",
    "--dp-size": "Data parallelism: alias of --data-parallel-size",
    "--enable-metrics": "Logging: enable Prometheus metrics",
    "--api-key": "API related: the server's API key, also for the OpenAI-compatible API",
    "--served-model-name": "API related: the model name /v1/models returns (one string)",
    "--speculative-algorithm": "Speculative decoding: EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM",
    "--speculative-draft-model-path": "Speculative decoding: the draft model weights",
    "--speculative-num-steps": "Speculative decoding: draft steps (depth)",
    "--speculative-eagle-topk": "Speculative decoding: tokens sampled per draft step (breadth)",
    "--speculative-num-draft-tokens": "Speculative decoding: draft tokens verified per step",
    "--speculative-ngram-max-bfs-breadth": "Ngram speculative decoding: maximum BFS breadth",
    "--disable-radix-cache": "Optimization/debug options: disable RadixAttention prefix caching",
    "--enable-cache-report": "Logging: report cached prompt tokens in usage "
                             "(prompt_tokens_details.cached_tokens)",
    "--disaggregation-mode": "PD disaggregation: prefill or decode (unset: not disaggregated)",
    "--disaggregation-transfer-backend": "PD disaggregation: mooncake, nixl, ascend or fake",
    "--disaggregation-bootstrap-port": "PD disaggregation: bootstrap server port (prefill)",
    "--enable-lora": "LoRA: enable LoRA support (implied by --lora-paths)",
    "--lora-paths": "LoRA: adapters to load, each PATH, NAME=PATH or a JSON object",
    "--max-lora-rank": "LoRA: the largest LoRA rank supported (else inferred from --lora-paths)",
    "--kv-cache-dtype": "Quantization and data type: KV cache dtype (auto, fp8_e5m2, fp8_e4m3)",
    "--enable-hierarchical-cache": "Hierarchical cache: enable the host-memory KV tier",
    "--hicache-size": "Hierarchical cache: host KV pool in GB; overrides --hicache-ratio",
    "--hicache-ratio": "Hierarchical cache: host KV pool size ÷ device pool size (default 2.0)",
    "--kv-events-config": "Observability: KV event publishing config in JSON; publishing is on "
                          "when set (0.5.23 arg_groups/fields/observability.py)",
})  # fmt: skip
"""SGLang's documented server arguments this module relies on → where the docs describe them."""

FLAGS: Mapping[str, str] = MappingProxyType({
    "model": "--model-path",
    "context_length": "--context-length",
    "host": "--host",
    "port": "--port",
    "dtype": "--dtype",
    "served_model_name": "--served-model-name",
    "metrics": "--enable-metrics",
    "api_key": "--api-key",
    "radix_off": "--disable-radix-cache",
    "cache_report": "--enable-cache-report",
    "chunk_tokens": "--chunked-prefill-size",
    "spec_algorithm": "--speculative-algorithm",
    "spec_draft_model": "--speculative-draft-model-path",
    "spec_steps": "--speculative-num-steps",
    "spec_topk": "--speculative-eagle-topk",
    "spec_draft_tokens": "--speculative-num-draft-tokens",
    "ngram_breadth": "--speculative-ngram-max-bfs-breadth",
    "pd_mode": "--disaggregation-mode",
    "pd_backend": "--disaggregation-transfer-backend",
    "pd_bootstrap_port": "--disaggregation-bootstrap-port",
    "kv_cache_dtype": "--kv-cache-dtype",
    "hicache_on": "--enable-hierarchical-cache",
    "hicache_size": "--hicache-size",
    "hicache_ratio": "--hicache-ratio",
    "kv_events": "--kv-events-config",
})  # fmt: skip
"""Lever or setting → SGLang flag; every value is in :data:`DOCUMENTED`."""

KV_CACHE_DTYPES: Mapping[str, str | None] = MappingProxyType({
    "auto": None, "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2",
})  # fmt: skip
"""Fleet-file ``kv_cache_dtype`` → ``--kv-cache-dtype`` (None: no flag, SGLang's ``auto``)."""

DOCUMENTED_KV_CACHE_DTYPES: frozenset[str] = frozenset({
    "auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1",
})  # fmt: skip
"""The documented choices of ``--kv-cache-dtype`` (server_args.py)."""

LORA_FLAGS: Mapping[str, str] = MappingProxyType({
    "lora_on": "--enable-lora",
    "lora_paths": "--lora-paths",
    "lora_rank": "--max-lora-rank",
})  # fmt: skip
"""The pool's LoRA adapters → SGLang flags (rendered only for a pool with adapters); every
value is in :data:`DOCUMENTED`."""

ALIASES: frozenset[str] = frozenset({"--model", "--speculative-draft-model",
                                     "--speculative-algo", "--disable-radix"})
"""Other spellings of flags in :data:`FLAGS` (documented aliases and argparse prefixes seen in
use), refused in ``engine_args`` like the flags themselves."""

CHUNKED_PREFILL_OFF = -1
"""``--chunked-prefill-size`` that disables chunked prefill (documented)."""

ALGORITHMS: Mapping[str, str] = MappingProxyType({
    "ngram": "NGRAM", "eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "EAGLE",
    "draft_model": "STANDALONE",
})  # fmt: skip
"""Fleet-file speculative method → ``--speculative-algorithm``; a method absent here (medusa)
has no SGLang counterpart."""

DOCUMENTED_ALGORITHMS: frozenset[str] = frozenset({"EAGLE", "EAGLE3", "NEXTN", "STANDALONE",
                                                   "NGRAM"})
"""The documented choices of ``--speculative-algorithm``."""

NEEDS_DRAFT_MODEL: frozenset[str] = frozenset({"eagle", "eagle3", "draft_model"})
"""Methods that must name a draft checkpoint (``--speculative-draft-model-path``)."""

TRANSFER_BACKENDS: frozenset[str] = frozenset({"mooncake", "nixl", "ascend", "fake"})
"""The documented choices of ``--disaggregation-transfer-backend``."""

PD_MODES: Mapping[Role, str] = MappingProxyType({Role.PREFILL: "prefill", Role.DECODE: "decode"})
"""Pool role → ``--disaggregation-mode`` (a mixed pool gets none)."""

DATA_PARALLEL_FLAGS: frozenset[str] = frozenset({"--data-parallel-size", "--dp-size"})
"""The data-parallel size's flags: each rank publishes KV events of its own."""

PARALLEL_FLAGS: tuple[frozenset[str], ...] = (
    frozenset({"--tensor-parallel-size", "--tp-size", "--tp"}),
    frozenset({"--pipeline-parallel-size", "--pp-size"}),
    DATA_PARALLEL_FLAGS,
)
"""Flags of ``engine_args`` whose values multiply into the GPUs one engine needs (``--tp`` is
the docs' own shorthand of ``--tp-size``)."""

SIDE_PORTS: Mapping[Role, Mapping[str, int]] = MappingProxyType(
    {Role.PREFILL: {"bootstrap": SGLANG_BOOTSTRAP_PORT}}
)
"""Ports an engine listens on besides its HTTP port, by pool role: a prefill engine's
bootstrap server, which decode engines reach."""


@dataclass(frozen=True, slots=True)
class SGLangSettings:
    """Settings that are not levers; None leaves a setting to SGLang. ``context_length`` in
    tokens; ``transfer_backend`` carries a P/D pool's KV (one of :data:`TRANSFER_BACKENDS`);
    ``kv_events_ports``: the (publish, replay) ports this one engine binds for its KV events,
    for engines sharing a host whose addresses the fleet file lists
    (:func:`backends.launch.vllm.engine_event_ports`); None = the pool's ``port`` and
    ``replay_port``."""

    host: str = "127.0.0.1"
    dtype: str | None = None
    context_length: int | None = None
    transfer_backend: str = "mooncake"
    kv_events_ports: tuple[int, int | None] | None = None


def sglang_args(pool: Pool, port: int, model_path: str,
                settings: SGLangSettings = SGLangSettings()) -> list[Arg]:
    """The flags (after ``python -m sglang.launch_server``) for one engine of ``pool``."""
    args: list[Arg] = [
        FLAGS["host"], settings.host,
        FLAGS["port"], str(port),
        FLAGS["model"], model_path,
        FLAGS["served_model_name"], pool.models[0],
        FLAGS["metrics"],
    ]  # fmt: skip
    if settings.dtype is not None:
        args += [FLAGS["dtype"], settings.dtype]
    if settings.context_length is not None:
        args += [FLAGS["context_length"], str(settings.context_length)]
    lora = lora_args(pool)
    args += lever_args(pool) + pd_args(pool, settings.transfer_backend) + lora
    args += kv_events_args(pool, FLAGS["kv_events"], DATA_PARALLEL_FLAGS, kv_events_config,
                           settings.kv_events_ports)
    args += api_key_args(pool, FLAGS["api_key"])
    rendered = flags_set(lora, set(LORA_FLAGS.values()))
    return args + extra_args(pool, set(FLAGS.values()) | ALIASES | rendered)


def lora_args(pool: Pool) -> list[Arg]:
    """The LoRA flags of a pool with adapters (module docstring); nothing without."""
    if not pool.adapters:
        return []
    args: list[Arg] = [LORA_FLAGS["lora_on"]]
    paths = [f"{a.name}={a.path}" for a in pool.adapters if a.path is not None]
    if paths:
        args += [LORA_FLAGS["lora_paths"], *paths]
    ranks = [a.rank for a in pool.adapters if a.rank is not None]
    if ranks:
        args += [LORA_FLAGS["lora_rank"], str(max(ranks))]
    return args


def lever_args(pool: Pool) -> list[Arg]:
    """The flags that set the pool's levers, each lever explicitly on or off."""
    levers = pool.levers
    # with the radix cache, report cached prompt tokens in usage (the lost-reuse figure)
    args: list[Arg] = [FLAGS["cache_report"] if levers.prefix_caching else FLAGS["radix_off"]]
    chunked = levers.chunked_prefill
    budget = chunked.token_budget if chunked is not None and chunked.enabled else None
    args += [FLAGS["chunk_tokens"], str(CHUNKED_PREFILL_OFF if budget is None else budget)]
    if levers.speculative is not None:
        args += speculative_args(levers.speculative)
    return args + capacity_args(pool)


def capacity_args(pool: Pool) -> list[Arg]:
    """The capacity levers' flags: KV dtype and hierarchical cache (module docstring)."""
    levers = pool.levers
    dtype = KV_CACHE_DTYPES[levers.kv_cache_dtype]
    args: list[Arg] = [] if dtype is None else [FLAGS["kv_cache_dtype"], dtype]
    tier = levers.host_kv_cache
    if tier is not None:  # the fleet file allows SGLang only hicache, in whole GB
        args += [FLAGS["hicache_on"], FLAGS["hicache_size"], str(int(tier.size_gb))]
    return args


def speculative_args(spec: Speculative) -> list[Arg]:
    """The speculative-decoding flags of a pool's speculative lever (a chain of K drafts)."""
    algorithm = ALGORITHMS.get(spec.method)
    if algorithm is None:
        raise LaunchError(f"speculative method {spec.method!r} has no SGLang algorithm; "
                          f"SGLang runs {', '.join(sorted(ALGORITHMS))}")
    k = spec.num_draft_tokens
    args: list[Arg] = [FLAGS["spec_algorithm"], algorithm]
    if algorithm == "NGRAM":
        return args + [FLAGS["spec_draft_tokens"], str(k + 1), FLAGS["ngram_breadth"], "1"]
    if spec.method in NEEDS_DRAFT_MODEL and spec.draft_model is None:
        raise LaunchError(f"speculative method {spec.method!r} needs a draft_model")
    if spec.draft_model is not None:
        args += [FLAGS["spec_draft_model"], spec.draft_model]
    return args + [FLAGS["spec_steps"], str(k), FLAGS["spec_topk"], "1",
                   FLAGS["spec_draft_tokens"], str(k + 1)]


def pd_args(pool: Pool, transfer_backend: str) -> list[Arg]:
    """The disaggregation flags of a prefill or decode pool; nothing for a mixed one."""
    mode = PD_MODES.get(pool.role)
    if mode is None:
        return []
    if transfer_backend not in TRANSFER_BACKENDS:
        raise LaunchError(f"unknown SGLang transfer backend {transfer_backend!r}; documented: "
                          f"{', '.join(sorted(TRANSFER_BACKENDS))}")
    return [FLAGS["pd_mode"], mode, FLAGS["pd_backend"], transfer_backend,
            FLAGS["pd_bootstrap_port"], str(SGLANG_BOOTSTRAP_PORT)]


def kv_events_config(events: KvEvents) -> dict[str, Any]:
    """The ``--kv-events-config`` object: SGLang's ZMQ publisher bound on every address."""
    config: dict[str, Any] = {"publisher": "zmq", "endpoint": f"tcp://*:{events.port}"}
    if events.replay_port is not None:
        config["replay_endpoint"] = f"tcp://*:{events.replay_port}"
    config["topic"] = events.topic
    return config


def deploy_args(pool: Pool, host: str, port: int, checkpoint: str) -> list[Arg]:
    """The flags of one engine of a deployment, listening on ``host``."""
    return sglang_args(pool, port, checkpoint, replace(SGLangSettings(), host=host))


LAUNCHER = Launcher(module=SERVER_MODULE, port=DEFAULT_PORT, args=deploy_args,
                    parallel=PARALLEL_FLAGS, side_ports=SIDE_PORTS)
"""SGLang's launch recipe for deployments (``ridge render``)."""
