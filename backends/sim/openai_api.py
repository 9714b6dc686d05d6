"""Reading OpenAI requests the way the engines do: fields honoured, defaults, validation errors.

:func:`parse_chat`, :func:`parse_completion` and :func:`parse_responses` honour ``model``
(vLLM: a served name, else 404; SGLang: not checked), the prompt or messages, the output
length (default: the rest of the context; 16 for completions), ``stream`` and its options,
``n`` (1 only), ``ignore_eos``, ``min_tokens`` and ``seed``; everything else is accepted
without effect. The Responses API's ``instructions`` and ``input`` become chat messages
(:func:`responses_messages`).

Refusals come in vLLM's order with the engine's own texts
(:class:`~backends.sim.behaviour.ErrorTexts`): the body (:mod:`backends.sim.validation`), the
model, the requested output against the context, then ``max_tokens`` and ``min_tokens``
(:func:`context_max_tokens`). See docs/simulator.md#reading-requests.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from backends.sim import tokens, validation
from backends.sim.behaviour import PROMPT_FORMS, Dialect, ErrorText, ErrorTexts
from backends.sim.validation import BodyInvalid, BodyKind, BodyUnreadable

ERROR_TYPES: Mapping[int, str] = MappingProxyType(
    {
        400: "BadRequestError",
        404: "NotFoundError",
        500: "InternalServerError",
        503: "ServiceUnavailableError",
    }
)


class ApiError(Exception):
    """An error answer: HTTP ``status``, message, the offending parameter and the error type
    (by default the one of :data:`ERROR_TYPES` for the status)."""

    def __init__(
        self, status: int, message: str, param: str | None = None, err_type: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type or ERROR_TYPES.get(status, "InternalServerError")
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


@dataclass(frozen=True, slots=True)
class Requested:
    """The output a request asks for [tokens] (None: as much as the context leaves) and the
    field that asked."""

    tokens: int | None
    param: str


def refusal(text: ErrorText, status: int = 400, **fields: Any) -> ApiError:
    """The answer ``text`` with ``fields`` filled in."""
    param = text.param.format(**fields) if text.param is not None else None
    return ApiError(status, text.message.format(**fields), param)


def body_error(exc: BodyInvalid, dialect: Dialect) -> ApiError:
    """The 400 of a body the engine's pydantic models refuse: vLLM's rendering
    (:func:`backends.sim.validation.render_errors`), or SGLang's, whose message ends with the
    list of errors and whose ``param`` is null."""
    texts = dialect.errors
    if texts.body_style == "vllm":
        message, param = validation.render_errors(exc.errors)
    else:
        message, param = str(exc.errors), None
    return ApiError(400, message, param, texts.body_error_type)


def read_body(raw: bytes, dialect: Dialect) -> dict[str, Any]:
    """A request's body as the JSON object every API takes; the engine's 400 otherwise (not
    JSON, empty, ``null``, or a JSON value that is no object)."""
    try:
        return validation.json_object(validation.parse_json(raw))
    except BodyUnreadable as exc:
        raise ApiError(400, str(exc), None, dialect.errors.body_error_type) from None
    except BodyInvalid as exc:
        raise body_error(exc, dialect) from None


def parse_chat(
    body: Mapping[str, Any], dialect: Dialect, info: ModelInfo, prompt_tokens: int | None = None
) -> Generation:
    """A chat request (``prompt_tokens``: the model's own count of the rendered prompt, when the
    endpoint has its tokenizer; else the estimate)."""
    values = _fields("chat", body, dialect)
    model = _model(values["model"], dialect, info)
    requested = _requested(values, "max_completion_tokens", "max_tokens")
    _check_output(requested, dialect.errors, info.max_context)
    if not values["messages"]:
        raise refusal(dialect.errors.empty_messages)
    prompt = tokens.render_chat(values["messages"], body.get("tools"))
    return _generation("chat", values, model, prompt, requested, dialect, info, prompt_tokens)


def parse_completion(
    body: Mapping[str, Any], dialect: Dialect, info: ModelInfo, prompt_tokens: int | None = None
) -> Generation:
    """A completions request (``prompt_tokens`` as for :func:`parse_chat`)."""
    values = _fields("completion", body, dialect)
    model = _model(values["model"], dialect, info)
    asked = values["max_tokens"]  # vLLM: absent or null is its default, 16
    if asked is None or "max_tokens" not in body:
        asked = dialect.completion_default_max_tokens
    requested = Requested(asked, "max_tokens")
    _check_output(requested, dialect.errors, info.max_context)
    if values["prompt"] == []:
        raise refusal(dialect.errors.no_prompts)
    prompt = tokens.completion_prompt_text(values["prompt"])
    if prompt is None:  # several prompts: the simulator serves one per request
        raise ApiError(400, PROMPT_FORMS, "prompt")
    ids = isinstance(values["prompt"], list) and isinstance(values["prompt"][0], int)
    return _generation("completion", values, model, prompt, requested, dialect, info,
                       prompt_tokens, counted_exactly=ids)


def parse_responses(body: Mapping[str, Any], dialect: Dialect, info: ModelInfo) -> Generation:
    """A Responses API request, as a chat one (module docstring)."""
    values = _fields("responses", body, dialect)
    model = _model(values["model"], dialect, info)
    requested = Requested(values["max_output_tokens"], "max_output_tokens")
    _check_output(requested, dialect.errors, info.max_context)
    if values["input"] == []:
        raise refusal(dialect.errors.empty_messages)
    prompt = tokens.render_chat(responses_messages(values), body.get("tools"))
    return _generation("chat", values, model, prompt, requested, dialect, info, None)


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
    """The model of a request outside the generation APIs (vLLM: 404 for a name it does not
    serve, without the list of served names its generation APIs add)."""
    model = body.get("model")
    if model is None:
        return info.served[0]
    if not isinstance(model, str):
        raise ApiError(400, "model must be a string", "model")
    if dialect.rejects_unknown_model and not info.answers_to(model):
        raise ApiError(404, f"The model `{model}` does not exist.", "model")
    return model


def _fields(kind: BodyKind, body: Mapping[str, Any], dialect: Dialect) -> dict[str, Any]:
    """The honoured fields of ``body``, coerced as the engine's models coerce them; first the
    checks its models make before the fields (the one declared last runs first)."""
    texts = dialect.errors
    if kind == "completion" and body.get("prompt") in (None, ""):
        raise refusal(texts.empty_prompt)
    if kind != "responses" and body.get("stream_options") and not body.get("stream"):
        raise refusal(texts.stream_options_without_stream)
    try:
        return validation.validate_body(kind, _tool_choice_filled(kind, body))
    except BodyInvalid as exc:
        raise body_error(exc, dialect) from None


def _tool_choice_filled(kind: BodyKind, body: Mapping[str, Any]) -> Mapping[str, Any]:
    """``body`` with the ``tool_choice`` vLLM's ``check_tool_usage`` writes into it before the
    fields are validated (so an error's ``<dict of N items>`` counts it): chat with tools and
    none chosen: ``auto``; Responses without tools: ``none``."""
    tools, choice = body.get("tools"), body.get("tool_choice", "auto")
    if kind == "chat" and tools and "tool_choice" not in body:
        return {**body, "tool_choice": "auto"}
    if kind == "responses" and not tools and choice in ("auto", "none"):
        return {**body, "tool_choice": "none"}
    return body


def _model(model: str | None, dialect: Dialect, info: ModelInfo) -> str:
    if not model:
        return info.served[0]
    if dialect.rejects_unknown_model and not info.answers_to(model):
        raise refusal(dialect.errors.unknown_model, 404, model=model,
                      served=", ".join(info.served))
    return model


def _requested(values: Mapping[str, Any], *fields: str) -> Requested:
    """The first of ``fields`` that is set (vLLM: ``max_completion_tokens`` over ``max_tokens``)."""
    for name in fields:
        if values.get(name) is not None:
            return Requested(values[name], name)
    return Requested(None, fields[-1])


def _check_output(requested: Requested, texts: ErrorTexts, limit: int) -> None:
    """An output longer than the whole context [tokens], refused before the prompt is read."""
    wanted = requested.tokens
    if texts.output_over_context is not None and wanted is not None and wanted > limit:
        raise refusal(texts.output_over_context, param=requested.param, max_tokens=wanted,
                      limit=limit)


def _generation(
    kind: Literal["chat", "completion"],
    values: Mapping[str, Any],
    model: str,
    prompt: str,
    requested: Requested,
    dialect: Dialect,
    info: ModelInfo,
    prompt_tokens: int | None,
    counted_exactly: bool = False,
) -> Generation:
    if values.get("n") not in (1, None):
        raise ApiError(400, "n must be 1: the simulator generates one choice", "n")
    count = prompt_tokens if prompt_tokens is not None else tokens.estimate_tokens(prompt)
    max_tokens = context_max_tokens(requested, count, dialect, info, counted_exactly)
    min_tokens = int(values.get("min_tokens", 0))
    _check_min_tokens(min_tokens, max_tokens, dialect.errors)
    options = values.get("stream_options")
    usage = bool(options is not None and options.include_usage)
    return Generation(
        kind=kind,
        model=model,
        prompt=prompt,
        prompt_tokens=count,
        max_tokens=max_tokens,
        stream=bool(values.get("stream")),
        include_usage=usage,
        continuous_usage=bool(usage and options is not None and options.continuous_usage_stats),
        ignore_eos=bool(values.get("ignore_eos")),
        min_tokens=min_tokens,
        seed=values.get("seed"),
    )


def context_max_tokens(
    requested: Requested, prompt: int, dialect: Dialect, info: ModelInfo,
    counted_exactly: bool = False,
) -> int:
    """The tokens a request of ``prompt`` tokens may generate, or the engine's refusal: a prompt
    longer than the context; SGLang: a prompt and output that do not fit (vLLM cuts the output
    to the context left); an output below one token. ``counted_exactly``: the prompt came as
    token ids, so vLLM states its whole count, not where its tokenizer stopped."""
    texts, limit = dialect.errors, info.max_context
    if prompt > limit or (prompt == limit and texts.full_context_refused):
        capped = texts.prompt_count_capped and not counted_exactly
        stated = min(prompt, limit + 1) if capped else prompt
        qualifier = "at least " if texts.prompt_count_capped and stated == limit + 1 else ""
        raise refusal(texts.prompt_too_long, limit=limit, count=stated, qualifier=qualifier)
    room, wanted = limit - prompt, requested.tokens
    over = texts.prompt_plus_output_over_context
    if over is not None and wanted is not None and wanted > room:
        raise refusal(over, limit=limit, prompt=prompt, max_tokens=wanted, total=prompt + wanted)
    max_tokens = room if wanted is None else min(wanted, room)
    if max_tokens < 1:
        raise refusal(texts.max_tokens_below_one, max_tokens=max_tokens)
    return max_tokens


def _check_min_tokens(min_tokens: int, max_tokens: int, texts: ErrorTexts) -> None:
    if min_tokens < 0:
        raise refusal(texts.min_tokens_negative, min_tokens=min_tokens)
    if texts.min_tokens_over_max is not None and min_tokens > max_tokens:
        raise refusal(texts.min_tokens_over_max, min_tokens=min_tokens, max_tokens=max_tokens)
