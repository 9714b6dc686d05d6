"""Reading OpenAI requests the way the engines do: fields honoured, defaults, validation errors.

Responses API (``/v1/responses``, :func:`parse_responses`): ``instructions`` becomes a system
message and ``input`` (a string: one user message; a list: its items, a text part of type
``input_text`` / ``output_text`` / ``text`` giving its text, an item without a role rendered as
a ``tool`` message of its JSON) the rest, through the same chat template; ``max_output_tokens``
(default: the rest of the context) and ``stream`` are honoured, as chat's fields are.

Honoured fields: ``model`` (vLLM: must be a served name, else 404 ``NotFoundError``; SGLang: not
checked), ``messages`` (chat) or ``prompt`` (completions: a string, a one-element list of
strings, or a list of token ids), ``max_tokens`` / ``max_completion_tokens`` (default: the rest of
the context for chat, 16 for completions), ``stream``, ``stream_options.include_usage`` and
``.continuous_usage_stats``, ``n`` (1 only), ``ignore_eos``, ``min_tokens``, ``seed``. Everything
else (sampling parameters, ``stop``, ``logprobs``, tools beyond their text) is accepted and has no
effect. A prompt that leaves no room for one generated token, or whose ``max_tokens`` would run
past the model's context, is refused with the engine's own 400 message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from backends.sim import tokens
from backends.sim.behaviour import Dialect

ERROR_TYPES: Mapping[int, str] = MappingProxyType(
    {
        400: "BadRequestError",
        404: "NotFoundError",
        500: "InternalServerError",
        503: "ServiceUnavailableError",
    }
)


class ApiError(Exception):
    """An error answer: HTTP ``status``, message, error type and the offending parameter."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = ERROR_TYPES.get(status, "InternalServerError")
        self.param = param


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the endpoint serves: its model names and context length [tokens], and its LoRA
    adapters as (name, path) pairs (path: the card's ``root``), served on top of the first
    model (their ``parent``)."""

    served: tuple[str, ...]
    max_context: int
    adapters: tuple[tuple[str, str], ...] = ()

    def answers_to(self, model: str) -> bool:
        """Whether ``model`` is a served name or an adapter."""
        return model in self.served or any(model == name for name, _ in self.adapters)


@dataclass(frozen=True, slots=True)
class Generation:
    """A validated request."""

    kind: Literal["chat", "completion"]
    model: str
    prompt: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    ignore_eos: bool
    min_tokens: int
    seed: int | None


def parse_chat(body: Mapping[str, Any], dialect: Dialect, info: ModelInfo) -> Generation:
    model = _model(body, dialect, info)
    messages = body.get("messages")
    if (
        not isinstance(messages, list)
        or not messages
        or not all(isinstance(m, dict) for m in messages)
    ):
        raise ApiError(400, "messages must be a non-empty list of message objects", "messages")
    prompt = tokens.render_chat(messages, body.get("tools"))
    requested = body.get("max_completion_tokens", body.get("max_tokens"))
    return _generation("chat", body, model, prompt, requested, None, dialect, info)


def parse_completion(body: Mapping[str, Any], dialect: Dialect, info: ModelInfo) -> Generation:
    model = _model(body, dialect, info)
    prompt = tokens.completion_prompt_text(body.get("prompt"))
    if prompt is None:
        raise ApiError(
            400,
            "prompt must be a string, one string in a list, or a list of token ids "
            "(the simulator serves one prompt per request)",
            "prompt",
        )
    default = dialect.completion_default_max_tokens
    return _generation(
        "completion", body, model, prompt, body.get("max_tokens"), default, dialect, info
    )


def parse_responses(body: Mapping[str, Any], dialect: Dialect, info: ModelInfo) -> Generation:
    model = _model(body, dialect, info)
    prompt = tokens.render_chat(responses_messages(body), body.get("tools"))
    prompt_tokens = tokens.estimate_tokens(prompt)
    max_tokens = _max_tokens(body.get("max_output_tokens"), None, prompt_tokens, dialect, info)
    seed = body.get("seed")
    return Generation(kind="chat", model=model, prompt=prompt, prompt_tokens=prompt_tokens,
                      max_tokens=max_tokens, stream=_flag(body, "stream"), include_usage=False,
                      continuous_usage=False, ignore_eos=False, min_tokens=0,
                      seed=seed if isinstance(seed, int) else None)


def responses_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A Responses request's ``instructions`` and ``input`` as chat messages (module
    docstring)."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    if not isinstance(items, list) or not items or not all(isinstance(i, dict) for i in items):
        raise ApiError(400, "input must be a string or a non-empty list of items", "input")
    for item in items:
        if isinstance(item.get("role"), str):
            messages.append({"role": item["role"], "content": item.get("content")})
        else:
            messages.append({"role": "tool", "content": json.dumps(item, sort_keys=True)})
    return messages


def model_of(body: Mapping[str, Any], dialect: Dialect, info: ModelInfo) -> str:
    """The request's model as the engine checks it (vLLM: 404 for a name it does not serve)."""
    return _model(body, dialect, info)


def _model(body: Mapping[str, Any], dialect: Dialect, info: ModelInfo) -> str:
    model = body.get("model")
    if model is None:
        return info.served[0]
    if not isinstance(model, str):
        raise ApiError(400, "model must be a string", "model")
    if dialect.rejects_unknown_model and not info.answers_to(model):
        raise ApiError(404, f"The model `{model}` does not exist.", "model")
    return model


def _generation(
    kind: Literal["chat", "completion"],
    body: Mapping[str, Any],
    model: str,
    prompt: str,
    requested: Any,
    default_max: int | None,
    dialect: Dialect,
    info: ModelInfo,
) -> Generation:
    if body.get("n", 1) not in (1, None):
        raise ApiError(400, "n must be 1: the simulator generates one choice", "n")
    stream = _flag(body, "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or (options and not stream):
        raise ApiError(
            400, "Stream options can only be defined when `stream=True`.", "stream_options"
        )
    prompt_tokens = tokens.estimate_tokens(prompt)
    max_tokens = _max_tokens(requested, default_max, prompt_tokens, dialect, info)
    return Generation(
        kind=kind,
        model=model,
        prompt=prompt,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=bool(options.get("include_usage")),
        continuous_usage=bool(
            options.get("include_usage") and options.get("continuous_usage_stats")
        ),
        ignore_eos=_flag(body, "ignore_eos"),
        min_tokens=_int(body, "min_tokens", 0),
        seed=body.get("seed") if isinstance(body.get("seed"), int) else None,
    )


def _max_tokens(
    requested: Any, default: int | None, prompt: int, dialect: Dialect, info: ModelInfo
) -> int:
    limit = info.max_context
    msgs = dialect.context_messages
    if prompt >= limit:
        raise ApiError(400, msgs.prompt_too_long.format(limit=limit, prompt=prompt))
    if requested is None:
        return min(default, limit - prompt) if default is not None else limit - prompt
    if not isinstance(requested, int) or isinstance(requested, bool) or requested < 1:
        raise ApiError(400, f"max_tokens must be at least 1, got {requested}.", "max_tokens")
    if prompt + requested > limit:
        text = msgs.max_tokens_too_large.format(
            limit=limit, prompt=prompt, max_tokens=requested, total=prompt + requested
        )
        raise ApiError(400, text, "max_tokens")
    return requested


def _flag(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"{name} must be a boolean", name)
    return bool(value)


def _int(body: Mapping[str, Any], name: str, default: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ApiError(400, f"{name} must be a non-negative integer", name)
    return value
