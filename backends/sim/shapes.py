"""The JSON an engine sends back, field for field, per dialect.

Chat stream (vLLM): a role chunk ``delta {"role": "assistant", "content": ""}``, then one chunk
per engine step with ``delta {"content": ...}``, the last of which carries ``finish_reason`` (and
``stop_reason``), then — with ``stream_options.include_usage`` — a chunk with ``"choices": []``
and ``usage``, then ``data: [DONE]``. Every chunk has ``id`` (``chatcmpl-`` + 32 hex), ``object``
``chat.completion.chunk``, ``created``, ``model`` and ``choices[{index, delta, logprobs,
finish_reason}]``. Completions stream the same way with ``object`` ``text_completion`` and
``choices[{index, text, logprobs, finish_reason, stop_reason}]``, without a role chunk. SGLang's
shapes differ by the extra fields of its :class:`~backends.sim.behaviour.Dialect` row.
"""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Literal

from backends.launch.sglang import FLAGS as SGLANG_FLAGS
from backends.launch.vllm import FLAGS as VLLM_FLAGS
from backends.sim.behaviour import JSON, Dialect
from backends.sim.openai_api import ApiError, ModelInfo
from config.engines import Engine
from config.pools import Pool

Kind = Literal["chat", "completion"]
DONE = b"data: [DONE]\n\n"
OBJECTS = MappingProxyType({"chat": "chat.completion", "completion": "text_completion"})
CHUNK_OBJECTS = MappingProxyType({"chat": "chat.completion.chunk", "completion": "text_completion"})
CACHE_REPORT_FLAGS = MappingProxyType({
    Engine.VLLM: VLLM_FLAGS["cache_report"],  # vLLM cli_args.py, default off
    Engine.SGLANG: SGLANG_FLAGS["cache_report"],  # SGLang server_args.py, default off
})
"""The flag with which each engine reports its cached prompt tokens as
``usage.prompt_tokens_details.cached_tokens`` (without it the field is null). ridge's launchers
render it for every pool with prefix caching; a pool's ``engine_args`` may add it to others."""


def sse(obj: JSON) -> bytes:
    """One server-sent event carrying ``obj`` as compact JSON."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def dumps(obj: JSON) -> str:
    return json.dumps(obj, separators=(",", ":"))


def error_body(dialect: Dialect, err: ApiError) -> JSON:
    """vLLM nests ``{"error": {...}}``; SGLang sends a flat ``{"object": "error", ...}``."""
    fields = {"message": err.message, "type": err.err_type, "param": err.param, "code": err.status}
    if dialect.error_style == "nested":
        return {"error": fields}
    return {"object": "error", **fields}


def models_body(dialect: Dialect, info: ModelInfo, created: int, perm_id: str) -> JSON:
    cards = []
    for name in info.served:
        card: JSON = {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": dialect.owned_by,
            "root": name,
            **dialect.model_card_extra,
            "max_model_len": info.max_context,
        }
        if dialect.error_style == "nested":
            card["permission"] = [_permission(perm_id, created)]
        cards.append(card)
    return {"object": "list", "data": cards + _adapter_cards(dialect, info, created, perm_id)}


def _adapter_cards(dialect: Dialect, info: ModelInfo, created: int, perm_id: str) -> list[JSON]:
    """LoRA adapters as vLLM lists them: ``root`` the adapter's path, ``parent`` the base
    model's served name, no ``max_model_len`` (``OpenAIServingModels.show_available_models``)."""
    cards = []
    for name, path in info.adapters:
        card: JSON = {"id": name, "object": "model", "created": created,
                      "owned_by": dialect.owned_by, "root": path, "parent": info.served[0],
                      "max_model_len": None}
        if dialect.error_style == "nested":
            card["permission"] = [_permission(perm_id, created)]
        cards.append(card)
    return cards


def _permission(perm_id: str, created: int) -> JSON:
    return {
        "id": perm_id,
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }


def usage(dialect: Dialect, prompt: int, completion: int, *, drop_none: bool = False) -> JSON:
    out: JSON = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }
    out.update((k, v) for k, v in dialect.usage_extra.items() if not (drop_none and v is None))
    return out


def reported_cached(pool: Pool, cached: int) -> int | None:
    """The cached prompt tokens the pool's engines report in usage (None: they do not)."""
    reports = pool.levers.prefix_caching or CACHE_REPORT_FLAGS[pool.engine] in pool.engine_args
    return cached if reports else None


def with_cached(use: JSON, cached: int | None) -> JSON:
    """``use`` with ``prompt_tokens_details.cached_tokens`` when the engine reports it."""
    return use if cached is None else {**use, "prompt_tokens_details": {"cached_tokens": cached}}


def response(dialect: Dialect, kind: Kind, head: JSON, text: str, finish: str, use: JSON) -> JSON:
    """A whole (non-streamed) answer. ``head`` holds ``id``, ``created`` and ``model``."""
    choice: JSON = {"index": 0}
    if kind == "chat":
        choice["message"] = {"role": "assistant", "content": text, **dialect.message_extra}
    else:
        choice["text"] = text
    choice.update(logprobs=None, finish_reason=finish, **dialect.final_choice_extra)
    body: JSON = {
        "id": head["id"],
        "object": OBJECTS[kind],
        "created": head["created"],
        "model": head["model"],
        "choices": [choice],
    }
    body.update(dialect.response_extra)
    body["usage"] = use
    return body


def chunk(
    dialect: Dialect,
    kind: Kind,
    head: JSON,
    piece: str | None,
    finish: str | None = None,
    *,
    role: bool = False,
) -> JSON:
    """One streamed chunk with ``piece`` of text (the role chunk when ``role``)."""
    choice: JSON = {"index": 0}
    if kind == "chat":
        choice["delta"] = {"role": "assistant", "content": ""} if role else {"content": piece}
    else:
        choice["text"] = piece or ""
    choice.update(logprobs=None, finish_reason=finish)
    last = finish is not None or kind == "completion"
    choice.update(dialect.final_choice_extra if last else dialect.chunk_choice_extra)
    return {
        "id": head["id"],
        "object": CHUNK_OBJECTS[kind],
        "created": head["created"],
        "model": head["model"],
        "choices": [choice],
        **dialect.chunk_top_extra,
    }


def usage_chunk(dialect: Dialect, kind: Kind, head: JSON, use: JSON) -> JSON:
    """The ``stream_options.include_usage`` chunk: no choices, the request's usage."""
    return {
        "id": head["id"],
        "object": CHUNK_OBJECTS[kind],
        "created": head["created"],
        "model": head["model"],
        "choices": [],
        "usage": use,
    }


def with_usage(body: JSON, use: JSON) -> JSON:
    """``body`` carrying per-chunk usage (``continuous_usage_stats``)."""
    return {**body, "usage": use}


def head(rid: str, created: int, model: str) -> JSON:
    return {"id": rid, "created": created, "model": model}
