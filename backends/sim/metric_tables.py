"""Each engine's metrics as data: names, HELP texts, label sets, histogram buckets.

:data:`METRIC_TABLES` holds one :class:`MetricTable` per engine. vLLM's
(:data:`VLLM_TABLE`) follows a real ``/metrics`` page of vLLM, plus the speculative-decoding
counters and the ``--enable-mfu-metrics`` estimates (the roofline's FLOPs and bytes); SGLang's
(:data:`SGLANG_TABLE`) follows its production-metrics documentation and its collector's source.
Hits per KV tier are named as each engine names them (vLLM counts a host tier as a KV
connector's external hits; SGLang by ``cache_source``).

Each :class:`MetricSpec` reads one *source* from the engine snapshot (see
:meth:`backends.sim.endpoint.SimEndpoint.snapshot`) or, for histograms, one stat name of
:mod:`backends.sim.stats`. See docs/simulator.md#metric-tables for the sources.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from config.engines import Engine

Kind = Literal["counter", "gauge", "histogram", "info"]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric: its kind, full name (counters without ``_total``), HELP text, the snapshot key
    it reads, which base label set it carries, and an optional label fanned out over the keys of
    the snapshot value (a mapping). ``only_if`` names a snapshot flag that must be true."""

    kind: Kind
    name: str
    help: str
    source: str
    labels: str = "base"
    fanout: str | None = None
    only_if: str | None = None


@dataclass(frozen=True, slots=True)
class MetricTable:
    label_sets: Mapping[str, tuple[str, ...]]
    sort_labels: bool
    created_series: bool
    specs: tuple[MetricSpec, ...]
    buckets: Mapping[str, tuple[float, ...] | str]


def buckets_1_2_5(limit: int) -> tuple[float, ...]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to ``limit``."""
    out: list[float] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > limit:
                return tuple(out)
            out.append(float(m * scale))
        scale *= 10


def resolve_buckets(table: MetricTable, max_context: int) -> dict[str, tuple[float, ...]]:
    """The table's histogram buckets with ``"1-2-5"`` expanded up to ``max_context``."""
    return {
        k: (buckets_1_2_5(max_context) if isinstance(v, str) else v)
        for k, v in table.buckets.items()
    }


def _c(name: str, help_: str, source: str, **kw: Any) -> MetricSpec:
    return MetricSpec("counter", name, help_, source, **kw)


def _g(name: str, help_: str, source: str, **kw: Any) -> MetricSpec:
    return MetricSpec("gauge", name, help_, source, **kw)


def _h(name: str, help_: str, source: str, **kw: Any) -> MetricSpec:
    return MetricSpec("histogram", name, help_, source, **kw)


_LAT = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
_ITL = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_TTFT = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
_P = "vllm:"
_PREFILL_TOK = "Number of prefill tokens processed."
_GEN_TOK = "Number of generation tokens processed."

VLLM_TABLE = MetricTable(
    label_sets=MappingProxyType(
        {"base": ("engine", "model_name"), "model": ("model_name",), "engine": ("engine",)}
    ),
    sort_labels=True,
    created_series=True,
    buckets=MappingProxyType(
        {
            "prompt_tokens": "1-2-5",
            "generation_tokens": "1-2-5",
            "max_tokens": "1-2-5",
            "prefill_computed_tokens": "1-2-5",
            "n": (1.0, 2.0, 5.0, 10.0, 20.0),
            "iteration_tokens": (
                1.0,
                8.0,
                16.0,
                32.0,
                64.0,
                128.0,
                256.0,
                512.0,
                1024.0,
                2048.0,
                4096.0,
                8192.0,
                16384.0,
            ),
            "ttft_s": _TTFT,
            "itl_s": _ITL,
            "tpot_s": _ITL,
            "e2e_s": _LAT,
            "queue_s": _LAT,
            "inference_s": _LAT,
            "prefill_s": _LAT,
            "decode_s": _LAT,
            "preemptions": (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0),
        }
    ),
    specs=(
        _c(
            _P + "estimated_flops_per_gpu",
            "Estimated number of floating point operations per GPU "
            "(for Model Flops Utilization calculations).",
            "flops",
        ),
        _c(
            _P + "estimated_read_bytes_per_gpu",
            "Estimated number of bytes read from memory per "
            "GPU (for Model Flops Utilization calculations).",
            "read_bytes",
        ),
        _c(
            _P + "estimated_write_bytes_per_gpu",
            "Estimated number of bytes written to memory per "
            "GPU (for Model Flops Utilization calculations).",
            "write_bytes",
        ),
        _g(
            _P + "num_requests_running", "Number of requests in model execution batches.", "running"
        ),
        _g(_P + "num_requests_waiting", "Number of requests waiting to be processed.", "waiting"),
        _g(
            _P + "num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason "
            "labels: 'capacity' = waiting for scheduling capacity; 'deferred' = deferred by "
            "transient constraints (LoRA budget, KV transfer, blocked status). Sum of all reasons "
            "equals vllm:num_requests_waiting.",
            "waiting_by_reason",
            fanout="reason",
        ),
        _g(
            _P + "engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; "
            "awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; "
            "discard_all = 1 means sleep level 2.",
            "sleep_state",
            fanout="sleep_state",
        ),
        _g(_P + "kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "kv_usage"),
        _c(
            _P + "prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            "prefix_queries",
        ),
        _c(
            _P + "prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            "prefix_hits",
        ),
        _c(
            _P + "external_prefix_cache_queries",
            "External prefix cache queries from KV connector "
            "cross-instance cache sharing, in terms of number of queried tokens.",
            "external_queries",
        ),
        _c(
            _P + "external_prefix_cache_hits",
            "External prefix cache hits from KV connector "
            "cross-instance cache sharing, in terms of number of cached tokens.",
            "external_hits",
        ),
        _c(
            _P + "kv_offload_load_bytes",
            "Total bytes loaded from offload storage to GPU.",
            "host_load_bytes",
            only_if="host_tier",
        ),
        _c(
            _P + "kv_offload_load_time",
            "Total load time from offload storage to GPU, in seconds.",
            "host_load_seconds",
            only_if="host_tier",
        ),
        _c(
            _P + "mm_cache_queries",
            "Multi-modal cache queries, in terms of number of queried items.",
            "zero",
        ),
        _c(
            _P + "mm_cache_hits",
            "Multi-modal cache hits, in terms of number of cached items.",
            "zero",
        ),
        _c(
            _P + "num_preemptions",
            "Cumulative number of preemption from the engine.",
            "preemptions",
        ),
        _c(_P + "prompt_tokens", _PREFILL_TOK, "prompt_tokens"),
        _c(
            _P + "prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            "prompt_by_source",
            fanout="source",
        ),
        _c(
            _P + "prompt_tokens_cached",
            "Number of cached prompt tokens (local + external).",
            "prompt_cached",
        ),
        _c(
            _P + "prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that "
            "supplied them: device (local HBM), host (offloaded to DRAM), disk, p2p (transferred "
            "from another vLLM instance) or external_unspecified. Counted at admission; sums to "
            "vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
            "cached_by_source",
            fanout="source",
        ),
        _c(_P + "generation_tokens", _GEN_TOK, "generation_tokens"),
        _c(
            _P + "request_success",
            "Count of successfully processed requests.",
            "finished",
            fanout="finished_reason",
        ),
        _c(
            _P + "admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            "admission_rejections",
            labels="model",
            fanout="reason",
        ),
        _h(_P + "request_prompt_tokens", _PREFILL_TOK, "prompt_tokens"),
        _h(_P + "request_generation_tokens", _GEN_TOK, "generation_tokens"),
        _h(
            _P + "iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            "iteration_tokens",
        ),
        _h(
            _P + "request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            "max_tokens",
        ),
        _h(_P + "request_params_n", "Histogram of the n request parameter.", "n"),
        _h(
            _P + "request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            "max_tokens",
        ),
        _h(
            _P + "time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            "ttft_s",
        ),
        _h(
            _P + "inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            "itl_s",
        ),
        _h(
            _P + "request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            "tpot_s",
        ),
        _h(
            _P + "e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            "e2e_s",
        ),
        _h(
            _P + "request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            "queue_s",
        ),
        _h(
            _P + "request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            "inference_s",
        ),
        _h(
            _P + "request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            "prefill_s",
        ),
        _h(
            _P + "request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            "decode_s",
        ),
        _h(
            _P + "request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            "preemptions",
        ),
        _h(
            _P + "request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            "prefill_computed_tokens",
        ),
        MetricSpec(
            "info",
            _P + "cache_config_info",
            "Information of the LLMEngine CacheConfig",
            "cache_config",
            labels="engine",
        ),
        _c(
            _P + "spec_decode_num_drafts",
            "Number of spec decoding drafts.",
            "spec_drafts",
            only_if="speculating",
        ),
        _c(
            _P + "spec_decode_num_draft_tokens",
            "Number of draft tokens.",
            "spec_draft_tokens",
            only_if="speculating",
        ),
        _c(
            _P + "spec_decode_num_accepted_tokens",
            "Number of accepted tokens.",
            "spec_accepted",
            only_if="speculating",
        ),
        _c(
            _P + "spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            "spec_accepted_per_pos",
            fanout="position",
            only_if="speculating",
        ),
    ),
)

_S = "sglang:"
SGLANG_TABLE = MetricTable(
    label_sets=MappingProxyType(
        {
            "base": ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"),
            "model": ("model_name",),
        }
    ),
    sort_labels=False,
    created_series=False,
    buckets=MappingProxyType(
        {
            "ttft_s": (
                0.1,
                0.2,
                0.4,
                0.6,
                0.8,
                1.0,
                2.0,
                4.0,
                6.0,
                8.0,
                10.0,
                20.0,
                40.0,
                60.0,
                80.0,
                100.0,
                200.0,
                400.0,
            ),
            "e2e_s": (
                0.1,
                0.2,
                0.4,
                0.6,
                0.8,
                1.0,
                2.0,
                4.0,
                6.0,
                8.0,
                10.0,
                20.0,
                40.0,
                60.0,
                80.0,
                100.0,
                200.0,
                400.0,
                600.0,
                1200.0,
                1800.0,
                2400.0,
            ),
            "itl_s": (
                0.002,
                0.004,
                0.006,
                0.008,
                0.010,
                0.015,
                0.020,
                0.025,
                0.030,
                0.035,
                0.040,
                0.060,
                0.080,
                0.100,
                0.200,
                0.400,
                0.600,
                0.800,
                1.0,
                2.0,
                4.0,
                6.0,
                8.0,
            ),
            "queue_s": (
                0.0,
                0.1,
                0.2,
                0.5,
                1.0,
                2.0,
                3.0,
                4.0,
                5.0,
                10.0,
                15.0,
                20.0,
                30.0,
                40.0,
                50.0,
                60.0,
                70.0,
                80.0,
                90.0,
                100.0,
                200.0,
                300.0,
                400.0,
                500.0,
                600.0,
                700.0,
                800.0,
                900.0,
                1000.0,
                1200.0,
                1400.0,
                1600.0,
                1800.0,
                2000.0,
                2500.0,
                3000.0,
            ),
        }
    ),
    specs=(
        _g(_S + "num_running_reqs", "The number of running requests.", "running"),
        _g(_S + "num_used_tokens", "The number of used tokens.", "used_tokens"),
        _g(_S + "token_usage", "The token usage.", "kv_usage"),
        _g(_S + "gen_throughput", "The generation throughput (token/s).", "gen_throughput"),
        _g(_S + "num_queue_reqs", "The number of requests in the waiting queue.", "queued"),
        _g(_S + "cache_hit_rate", "The prefix cache hit rate.", "cache_hit_rate"),
        _g(
            _S + "max_total_num_tokens",
            "Maximum total number of tokens in the KV cache pool.",
            "capacity_tokens",
        ),
        _g(
            _S + "spec_accept_length",
            "The average acceptance length of speculative decoding.",
            "spec_accept_length",
        ),
        _g(
            _S + "spec_accept_rate",
            "The average acceptance rate of speculative decoding "
            "(`accepted tokens / total draft tokens` in batch).",
            "spec_accept_rate",
        ),
        _c(_S + "num_retracted_requests", "Total number of retracted requests.", "preemptions"),
        _g(
            _S + "num_prefill_inflight_queue_reqs",
            "The number of requests in the prefill inflight queue.",
            "held",
        ),
        _g(
            _S + "num_decode_transfer_queue_reqs",
            "The number of requests in the decode transfer queue.",
            "transferring",
        ),
        _c(
            _S + "realtime_tokens",
            "Total number of tokens processed (updated on each log "
            "interval). mode: prefill_compute, prefill_cache, decode.",
            "realtime_tokens",
            fanout="mode",
        ),
        _h(_S + "queue_time_seconds", "Histogram of queueing time in seconds.", "queue_s"),
        _c(_S + "prompt_tokens", _PREFILL_TOK, "prompt_tokens", labels="model"),
        _c(_S + "generation_tokens", _GEN_TOK, "generation_tokens", labels="model"),
        _c(
            _S + "cached_tokens",
            "Number of cached prompt tokens by source (device/host/storage).",
            "cached_by_cache_source",
            labels="model",
            fanout="cache_source",
        ),
        _g(
            _S + "hicache_host_used_tokens",
            "Number of tokens currently used in the host KV cache.",
            "host_used_tokens",
            only_if="host_tier",
        ),
        _g(
            _S + "hicache_host_total_tokens",
            "Total capacity of the host KV cache in tokens.",
            "host_total_tokens",
            only_if="host_tier",
        ),
        _c(
            _S + "num_requests",
            "Number of requests processed.",
            "requests_finished",
            labels="model",
        ),
        _c(_S + "num_aborted_requests", "Number of requests aborted.", "aborted", labels="model"),
        _h(
            _S + "time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            "ttft_s",
            labels="model",
        ),
        _h(
            _S + "inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            "itl_s",
            labels="model",
        ),
        _h(
            _S + "e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            "e2e_s",
            labels="model",
        ),
    ),
)

VLLM_CACHE_CONFIG_STATIC: Mapping[str, str] = MappingProxyType(
    {
        "_block_size_resolved": "True",
        "cache_hit_alignment_tokens": "None",
        "enable_mamba_shared_prefix_checkpoint": "False",
        "hash_block_size": "None",
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "auto",
        "prefix_cache_retention_interval": "0",
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "skip_page_size_padded": "None",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": "False",
    }
)
"""``vllm:cache_config_info`` labels that do not depend on the engine's configuration."""

METRIC_TABLES: Mapping[Engine, MetricTable] = MappingProxyType(
    {Engine.VLLM: VLLM_TABLE, Engine.SGLANG: SGLANG_TABLE}
)
