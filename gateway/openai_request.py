"""Read the few fields ridge needs from an OpenAI request body; leave the rest untouched.

ridge parses ``model``, ``messages`` (chat) or ``prompt`` (completions), ``stream``,
``stream_options``, ``max_tokens`` / ``max_completion_tokens`` and ``user``, and checks their
types. Every other field (tools, response_format, logprobs, seed, ...) is neither read nor
rewritten: the engine receives the client's bytes as sent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gateway.errors import GatewayError

MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects a request body may have (OpenAI's request schemas,
tool parameter schemas included, stay far below)."""
MAX_TOKENS = 2**31 - 1
"""Largest ``max_tokens`` / ``max_completion_tokens`` accepted (what engines store it in)."""


class Endpoint(StrEnum):
    """The two generation APIs, by the engine path they are forwarded to."""

    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """What ridge read of one request; ``body`` is forwarded byte for byte."""

    endpoint: Endpoint
    model: str
    stream: bool
    include_usage: bool
    max_tokens: int | None
    user: str | None
    payload: dict[str, Any]
    body: bytes


def parse_request(endpoint: Endpoint, body: bytes) -> ParsedRequest:
    """Validate ``body``; raises a 400 GatewayError naming the offending field."""
    payload = _json_object(body)
    model = _required_str(payload, "model")
    if endpoint is Endpoint.CHAT:
        _check_messages(payload)
    else:
        _check_prompt(payload)
    stream = _optional(payload, "stream", bool) or False
    return ParsedRequest(
        endpoint=endpoint,
        model=model,
        stream=stream,
        include_usage=_include_usage(payload, stream),
        max_tokens=_max_tokens(payload),
        user=_optional(payload, "user", str),
        payload=payload,
        body=body,
    )


def _bad(message: str, param: str | None, code: str = "invalid_value") -> GatewayError:
    return GatewayError(400, message, param=param, code=code)


def _json_object(body: bytes) -> dict[str, Any]:
    if not body.strip():
        raise _bad("request body is empty; expected a JSON object", None, "invalid_json")
    try:
        payload = json.loads(body)
    except RecursionError:
        raise _too_deep() from None
    except ValueError as exc:  # invalid JSON, bad UTF-8, an integer of > 4300 digits
        raise _bad(f"request body is not valid JSON: {exc}", None, "invalid_json") from None
    if not isinstance(payload, dict):
        raise _bad("request body must be a JSON object", None, "invalid_json")
    if body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH and \
            _depth(payload) > MAX_JSON_DEPTH:
        raise _too_deep()
    return payload


def _too_deep() -> GatewayError:
    return _bad(f"request body is nested deeper than {MAX_JSON_DEPTH} levels", None,
                "invalid_json")


def _depth(value: Any) -> int:
    """The nesting depth of a parsed JSON value (a scalar is 0), without recursion; stops
    counting past :data:`MAX_JSON_DEPTH`."""
    deepest, level = 0, [(value, 0)]
    while level:
        item, depth = level.pop()
        if isinstance(item, dict | list) and item:
            if depth + 1 > MAX_JSON_DEPTH:
                return depth + 1
            deepest = max(deepest, depth + 1)
            level.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict)
                                                  else item))
        elif isinstance(item, dict | list):
            deepest = max(deepest, depth + 1)
    return deepest


def _type_name(kind: type | tuple[type, ...]) -> str:
    names = {bool: "a boolean", str: "a string", int: "an integer", dict: "an object"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _optional(payload: dict[str, Any], name: str, kind: type) -> Any:
    value = payload.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _bad(f"'{name}' must be {_type_name(kind)}", name, "invalid_type")
    return value


def _required_str(payload: dict[str, Any], name: str) -> str:
    if name not in payload:
        raise _bad(f"'{name}' is required", name, "missing_required_parameter")
    value = _optional(payload, name, str)
    if not value:
        raise _bad(f"'{name}' must be a non-empty string", name, "invalid_type")
    return str(value)


def _check_messages(payload: dict[str, Any]) -> None:
    if "messages" not in payload:
        raise _bad("'messages' is required", "messages", "missing_required_parameter")
    messages = payload["messages"]
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty array", "messages", "invalid_type")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _bad(f"'messages[{i}]' must be an object", f"messages[{i}]", "invalid_type")
        if not isinstance(message.get("role"), str):
            raise _bad(
                f"'messages[{i}].role' must be a string", f"messages[{i}].role", "invalid_type"
            )


def _check_prompt(payload: dict[str, Any]) -> None:
    if "prompt" not in payload:
        raise _bad("'prompt' is required", "prompt", "missing_required_parameter")
    prompt = payload["prompt"]
    if isinstance(prompt, str):
        return
    ok = isinstance(prompt, list) and prompt and all(_prompt_item(p) for p in prompt)
    if not ok:
        raise _bad(
            "'prompt' must be a string, an array of strings or an array of token ids",
            "prompt",
            "invalid_type",
        )


def _prompt_item(item: Any) -> bool:
    if isinstance(item, str) or (isinstance(item, int) and not isinstance(item, bool)):
        return True
    return isinstance(item, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in item
    )


def _include_usage(payload: dict[str, Any], stream: bool) -> bool:
    options = _optional(payload, "stream_options", dict)
    if options is None:
        return False
    flag = options.get("include_usage")
    if flag is not None and not isinstance(flag, bool):
        raise _bad(
            "'stream_options.include_usage' must be a boolean",
            "stream_options.include_usage",
            "invalid_type",
        )
    return bool(flag) and stream


def _max_tokens(payload: dict[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = _optional(payload, name, int)
        if value is not None:
            if not 1 <= value <= MAX_TOKENS:
                raise _bad(f"'{name}' must be between 1 and {MAX_TOKENS}", name)
            return int(value)
    return None
