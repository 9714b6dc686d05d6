"""How each simulated engine behaves, as data: one :class:`Dialect` row per engine (vLLM, SGLang).

Everything engine-specific that the simulator's engine loop and HTTP layer need is a field here
(metric names live in :mod:`backends.sim.metric_tables`, keyed by the same engine). Sources: vLLM's
OpenAI server (``ErrorResponse`` nests ``error``; ids ``chatcmpl-``/``cmpl-`` + hex; 404
``NotFoundError`` for an unknown model; ``stop_reason`` on finished choices; V1 scheduler mixes
prefill chunks and decodes; 16-token KV blocks on GPUs, 128 on the CPU backend; chunked prefill off
→ ``max_num_batched_tokens = max(max_model_len, 2048)``; ``gpu_memory_utilization`` 0.9) and
SGLang's (flat ``{"object": "error", ...}``; plain hex ids; the model field is not checked and is
echoed back; ``matched_stop`` on choices and ``"usage": null`` on chunks; a prefill-first scheduler
unless ``--enable-mixed-chunk``; one-token pages; ``max_prefill_tokens`` 16384;
``/health_generate``;
P/D over a bootstrap server named by ``bootstrap_host``/``bootstrap_port``/``bootstrap_room``).
Score and rerank paths: vLLM 0.32 serves ``/score``, ``/v1/score``, ``/rerank``, ``/v1/rerank``
and ``/v2/rerank`` (``vllm/entrypoints/pooling/scoring/api_router.py``); SGLang ``/v1/score``
and ``/v1/rerank`` (its native API documentation).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from backends.fleet_file import Engine, Role

JSON = dict[str, Any]


def _frozen(d: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(d))


def _empty() -> Mapping[Any, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ContextMessages:
    """Error message templates for prompts that do not fit (``{limit}``, ``{prompt}``,
    ``{max_tokens}``, ``{total}`` are filled in)."""

    prompt_too_long: str
    max_tokens_too_large: str


@dataclass(frozen=True, slots=True)
class Dialect:
    """One engine's behaviour: KV block sizes by device kind, memory share, scheduler policy and
    budgets, API ids, error and JSON shapes, health paths, P/D protocol."""

    engine: Engine
    version: str
    block_size: Mapping[str, int]
    memory_fraction: float
    mixed_batches: bool
    unchunked_min_budget: int
    max_num_seqs: int
    completion_default_max_tokens: int
    chat_id_prefix: str
    completion_id_prefix: str
    owned_by: str
    rejects_unknown_model: bool
    health_paths: tuple[str, ...]
    error_style: Literal["nested", "flat"]
    context_messages: ContextMessages
    pd_protocol: Literal["kv_transfer_params", "bootstrap"]
    pd_requires_bootstrap: bool
    pd_prefill_forces_one_token: bool
    engine_type_label: Mapping[Role, str] = field(default_factory=_empty)
    chunk_top_extra: Mapping[str, Any] = field(default_factory=_empty)
    chunk_choice_extra: Mapping[str, Any] = field(default_factory=_empty)
    final_choice_extra: Mapping[str, Any] = field(default_factory=_empty)
    message_extra: Mapping[str, Any] = field(default_factory=_empty)
    response_extra: Mapping[str, Any] = field(default_factory=_empty)
    usage_extra: Mapping[str, Any] = field(default_factory=_empty)
    model_card_extra: Mapping[str, Any] = field(default_factory=_empty)
    score_paths: tuple[str, ...] = ("/v1/score",)
    rerank_paths: tuple[str, ...] = ("/v1/rerank",)


VLLM = Dialect(
    engine=Engine.VLLM,
    version="0.32.0",
    block_size=_frozen({"gpu": 16, "cpu": 128}),
    memory_fraction=0.9,
    mixed_batches=True,
    unchunked_min_budget=2048,
    max_num_seqs=256,
    completion_default_max_tokens=16,
    chat_id_prefix="chatcmpl-",
    completion_id_prefix="cmpl-",
    owned_by="vllm",
    rejects_unknown_model=True,
    health_paths=("/health",),
    error_style="nested",
    context_messages=ContextMessages(
        prompt_too_long=(
            "This model's maximum context length is {limit} tokens. However, your request has "
            "{prompt} input tokens. Please reduce the length of the input messages."
        ),
        max_tokens_too_large=(
            "'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
            "maximum context length is {limit} tokens and your request has {prompt} input tokens "
            "({max_tokens} > {limit} - {prompt})."
        ),
    ),
    pd_protocol="kv_transfer_params",
    pd_requires_bootstrap=False,
    pd_prefill_forces_one_token=False,
    final_choice_extra=_frozen({"stop_reason": None}),
    message_extra=_frozen(
        {
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "tool_calls": [],
            "reasoning_content": None,
        }
    ),
    response_extra=_frozen(
        {
            "service_tier": None,
            "system_fingerprint": None,
            "prompt_logprobs": None,
            "kv_transfer_params": None,
        }
    ),
    usage_extra=_frozen({"prompt_tokens_details": None}),
    model_card_extra=_frozen({"parent": None}),
    score_paths=("/score", "/v1/score"),
    rerank_paths=("/rerank", "/v1/rerank", "/v2/rerank"),
)

SGLANG = Dialect(
    engine=Engine.SGLANG,
    version="0.5.23",
    block_size=_frozen({"gpu": 1, "cpu": 1}),
    memory_fraction=0.88,
    mixed_batches=False,
    unchunked_min_budget=16384,
    max_num_seqs=256,
    completion_default_max_tokens=16,
    chat_id_prefix="",
    completion_id_prefix="",
    owned_by="sglang",
    rejects_unknown_model=False,
    health_paths=("/health", "/health_generate"),
    error_style="flat",
    context_messages=ContextMessages(
        prompt_too_long=(
            "The input ({prompt} tokens) is longer than the model's context length ({limit} "
            "tokens)."
        ),
        max_tokens_too_large=(
            "Requested token count exceeds the model's maximum context length of {limit} tokens. "
            "You requested a total of {total} tokens: {prompt} tokens from the input messages and "
            "{max_tokens} tokens for the completion. Please reduce the number of tokens in the "
            "input messages or the completion to fit within the limit."
        ),
    ),
    pd_protocol="bootstrap",
    pd_requires_bootstrap=True,
    pd_prefill_forces_one_token=True,
    engine_type_label=MappingProxyType(
        {Role.MIXED: "unified", Role.PREFILL: "prefill", Role.DECODE: "decode"}
    ),
    chunk_top_extra=_frozen({"usage": None}),
    chunk_choice_extra=_frozen({"matched_stop": None}),
    final_choice_extra=_frozen({"matched_stop": None}),
    message_extra=_frozen({"reasoning_content": None, "tool_calls": None}),
    response_extra=_frozen({"metadata": None}),
    usage_extra=_frozen({"prompt_tokens_details": None, "reasoning_tokens": 0}),
    model_card_extra=_frozen({"parent": None}),
)

DIALECTS: Mapping[Engine, Dialect] = MappingProxyType({Engine.VLLM: VLLM, Engine.SGLANG: SGLANG})
