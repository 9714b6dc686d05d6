"""Read the few fields ridge needs from an OpenAI request body; leave the rest untouched.

Chat and completions: ``model``, ``messages`` or ``prompt``, ``stream``, ``stream_options``,
``max_tokens`` / ``max_completion_tokens`` and ``user``, type-checked; every other field is
neither read nor rewritten, so the engine receives the client's bytes as sent. The other APIs
the engines serve (:class:`ApiPath`: Responses, embeddings, tokenize, detokenize, score,
rerank) are read the same way, ``model`` required and only their input checked for presence
and shape; the engine validates the rest.

:data:`GENERATION` names the APIs that generate, :data:`NO_INFERENCE` those that run no model.
See docs/gateway.md#request-bodies for each API's fields.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final

from gateway.server.errors import GatewayError
from routing.native_value import NativeValue

MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects a request body may have (OpenAI's request schemas,
tool parameter schemas included, stay far below)."""
MAX_TOKENS = 2**31 - 1
"""Largest ``max_tokens`` / ``max_completion_tokens`` accepted (what engines store it in)."""


class ApiPath(StrEnum):
    """The APIs ridge routes to engines, by the path a client calls and the engine is sent
    (vLLM's aliases each keep their own path: an engine answers them as it would directly).
    Paths as vLLM 0.32 serves them (``vllm/entrypoints/openai/responses/api_router.py``,
    ``pooling/embed/api_router.py``, ``pooling/scoring/api_router.py``,
    ``serve/tokenize/api_router.py``); SGLang serves ``/v1/embeddings``, ``/v1/score``,
    ``/v1/rerank``, ``/tokenize`` and ``/detokenize`` among them."""

    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"
    RESPONSES = "/v1/responses"
    EMBEDDINGS = "/v1/embeddings"
    TOKENIZE = "/tokenize"
    DETOKENIZE = "/detokenize"
    SCORE = "/score"
    SCORE_V1 = "/v1/score"
    RERANK = "/rerank"
    RERANK_V1 = "/v1/rerank"
    RERANK_V2 = "/v2/rerank"


GENERATION: frozenset[ApiPath] = frozenset(
    {ApiPath.CHAT, ApiPath.COMPLETIONS, ApiPath.RESPONSES})
"""The APIs that generate text: routed by the lever policy, streamed when asked. The others
are routed by load alone and answered whole."""
NO_INFERENCE: frozenset[ApiPath] = frozenset({ApiPath.TOKENIZE, ApiPath.DETOKENIZE})
"""The APIs that run no model on the engine: they teach the router state nothing, are held
to no SLO and use no tokens of a key's limits."""


class ParsedRequest(NativeValue):
    """What ridge read of one request; ``body`` is forwarded byte for byte."""

    FIELDS = ("api_path", "model", "stream", "include_usage", "max_tokens", "user", "payload",
              "body")
    __slots__ = FIELDS

    def __init__(self, api_path: ApiPath, model: str, stream: bool, include_usage: bool,
                 max_tokens: int | None, user: str | None, payload: dict[str, Any],
                 body: bytes) -> None:
        self.api_path: Final = api_path
        self.model: Final = model
        self.stream: Final = stream
        self.include_usage: Final = include_usage
        self.max_tokens: Final = max_tokens
        self.user: Final = user
        self.payload: Final = payload
        self.body: Final = body

    def _sent_as(self, payload: dict[str, Any], body: bytes) -> ParsedRequest:
        return ParsedRequest(self.api_path, self.model, self.stream, self.include_usage,
                             self.max_tokens, self.user, payload, body)

    def with_payload(self, payload: dict[str, Any]) -> ParsedRequest:
        """This request sent with ``payload`` instead (its body re-encoded); what ridge read of
        the client's request stays."""
        return self._sent_as(payload, json.dumps(payload).encode())

    def with_member(self, key: str, item: Any, member: bytes | None = None) -> ParsedRequest:
        """This request sent with the member ``key``: ``item`` added (``key`` must not be in
        the payload); ``member``: its JSON text (``"key": item``) when the caller keeps it
        encoded. A body of plain UTF-8 JSON (the object from its first byte to its last,
        whitespace aside) gets the member's bytes inserted before its closing brace, the rest
        forwarded as the client sent it and not encoded again; any other body (a byte-order
        mark, UTF-16 or UTF-32) is re-encoded whole (:meth:`with_payload`)."""
        if key in self.payload:
            raise ValueError(f"{key!r} is already in the request")
        payload = {**self.payload, key: item}
        body = self.body.rstrip()
        if body[-1:] != b"}" or self.body.lstrip()[:1] != b"{":
            return self.with_payload(payload)
        if member is None:
            member = json.dumps({key: item}).encode()[1:-1]
        comma = b"," if self.payload else b""
        return self._sent_as(payload, body[:-1] + comma + member + b"}")


def parse_request(api_path: ApiPath, body: bytes) -> ParsedRequest:
    """Validate ``body``; raises a 400 GatewayError naming the offending field."""
    payload = _json_object(body)
    model = _required_str(payload, "model")
    check = _CHAT_OR_COMPLETIONS.get(api_path)
    if check is None:
        return _OTHER_PARSERS[api_path](api_path, model, payload, body)
    check(payload)
    stream = _optional(payload, "stream", bool) or False
    return ParsedRequest(
        api_path=api_path,
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


SCAN_JSON: Final[Callable[[str, int], tuple[Any, int]]] = \
    json.JSONDecoder().scan_once  # type: ignore[attr-defined]
"""json's C scanner (what ``json.loads`` ends in): ``SCAN_JSON(text, at)`` is the value that
starts at ``at`` and the index after it; StopIteration when none starts there, JSONDecodeError
when it is malformed. Its memo is cleared at each call."""


def loads(body: bytes) -> Any:
    """``json.loads(body)`` (a request's body, a stream's usage event); a body in plain UTF-8
    opening with ``{`` (the common case) goes straight to the scanner, without json's encoding
    detection and its three Python calls. Whatever the scanner refuses goes to ``json.loads``,
    for its error."""
    if body[:1] != b"{" or body[1:2] == b"\x00":
        return json.loads(body)
    text = body.decode("utf-8", "surrogatepass")
    try:
        value, end = SCAN_JSON(text, 0)
    except StopIteration:
        return json.loads(text)
    if end != len(text) and text[end:].strip(" \t\n\r"):
        return json.loads(text)  # data after the value
    return value


def _json_object(body: bytes) -> dict[str, Any]:
    if body[:1] != b"{" and not body.strip():  # "{": not empty, and no copy of the body made
        raise _bad("request body is empty; expected a JSON object", None, "invalid_json")
    try:
        payload = loads(body)
    except RecursionError:
        raise _too_deep() from None
    except ValueError as exc:  # invalid JSON, bad UTF-8, an integer of > 4300 digits
        raise _bad(_not_json(exc), None, "invalid_json") from None
    if not isinstance(payload, dict):
        raise _bad("request body must be a JSON object", None, "invalid_json")
    if body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH and \
            _depth(payload) > MAX_JSON_DEPTH:
        raise _too_deep()
    return payload


def _not_json(exc: ValueError) -> str:
    """What is wrong with a body ``json.loads`` refused, in ridge's words (not the decoder's
    or the codec's)."""
    if isinstance(exc, json.JSONDecodeError):
        return f"request body is not valid JSON (at line {exc.lineno}, column {exc.colno})"
    if isinstance(exc, UnicodeDecodeError):
        return (f"request body is not valid {exc.encoding.upper()} text (byte "
                f"{exc.object[exc.start]:#04x} at offset {exc.start}); send UTF-8 JSON")
    if "digits" in str(exc):
        return (f"request body has an integer of more than {sys.get_int_max_str_digits()} "
                "digits")
    return "request body is not valid JSON"


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


def _check_input(payload: dict[str, Any], name: str = "input") -> None:
    """``name`` is required: a non-empty string or a non-empty array."""
    if name not in payload:
        raise _bad(f"'{name}' is required", name, "missing_required_parameter")
    value = payload[name]
    if not isinstance(value, str | list) or not value:
        raise _bad(f"'{name}' must be a non-empty string or a non-empty array", name,
                   "invalid_type")


def _check_array(payload: dict[str, Any], name: str) -> None:
    """``name`` is required: a non-empty array."""
    if name not in payload:
        raise _bad(f"'{name}' is required", name, "missing_required_parameter")
    if not isinstance(payload[name], list) or not payload[name]:
        raise _bad(f"'{name}' must be a non-empty array", name, "invalid_type")


def _check_responses_input(payload: dict[str, Any]) -> None:
    _check_input(payload)
    items = payload["input"]
    if isinstance(items, list):
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise _bad(f"'input[{i}]' must be an object", f"input[{i}]", "invalid_type")
    _optional(payload, "instructions", str)


def _check_embeddings(payload: dict[str, Any]) -> None:
    if "input" not in payload and "messages" in payload:
        _check_array(payload, "messages")
    else:
        _check_input(payload)


def _check_tokenize(payload: dict[str, Any]) -> None:
    if "prompt" not in payload and "messages" in payload:
        _check_array(payload, "messages")
        return
    if "prompt" not in payload:
        raise _bad("'prompt' or 'messages' is required", "prompt", "missing_required_parameter")
    _optional(payload, "prompt", str)


def _check_detokenize(payload: dict[str, Any]) -> None:
    if "tokens" not in payload:
        raise _bad("'tokens' is required", "tokens", "missing_required_parameter")
    tokens = payload["tokens"]
    ok = isinstance(tokens, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens)
    if not ok:
        raise _bad("'tokens' must be an array of token ids", "tokens", "invalid_type")


SCORE_PAIRS = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"),
               ("text_1", "text_2"))
"""The pairs of inputs vLLM's score API takes (``ScoreRequest``), the first one present used."""


def _check_score(payload: dict[str, Any]) -> None:
    for first, second in SCORE_PAIRS:
        if first in payload and second in payload:
            _check_input(payload, first)
            _check_input(payload, second)
            return
    names = ", ".join(f"'{a}' and '{b}'" for a, b in SCORE_PAIRS)
    raise _bad(f"one of the pairs {names} is required", SCORE_PAIRS[0][0],
               "missing_required_parameter")


def _check_rerank(payload: dict[str, Any]) -> None:
    _check_input(payload, "query")
    _check_input(payload, "documents")


def _parse_responses(api_path: ApiPath, model: str, payload: dict[str, Any],
                     body: bytes) -> ParsedRequest:
    """A Responses API request: its stream always carries its usage (``include_usage``)."""
    _check_responses_input(payload)
    stream = _optional(payload, "stream", bool) or False
    max_tokens = _optional(payload, "max_output_tokens", int)
    if max_tokens is not None and not 1 <= max_tokens <= MAX_TOKENS:
        raise _bad(f"'max_output_tokens' must be between 1 and {MAX_TOKENS}",
                   "max_output_tokens")
    return ParsedRequest(api_path=api_path, model=model, stream=stream, include_usage=stream,
                         max_tokens=max_tokens, user=_optional(payload, "user", str),
                         payload=payload, body=body)


_Parser = Callable[[ApiPath, str, dict[str, Any], bytes], ParsedRequest]


def _parse_whole(check: Callable[[dict[str, Any]], None]) -> _Parser:
    """The parser of an API answered whole, whose input ``check`` validates."""

    def parse(api_path: ApiPath, model: str, payload: dict[str, Any],
              body: bytes) -> ParsedRequest:
        check(payload)
        return ParsedRequest(api_path=api_path, model=model, stream=False, include_usage=False,
                             max_tokens=None, user=_optional(payload, "user", str),
                             payload=payload, body=body)
    return parse


_CHAT_OR_COMPLETIONS: Mapping[ApiPath, Callable[[dict[str, Any]], None]] = MappingProxyType({
    ApiPath.CHAT: _check_messages, ApiPath.COMPLETIONS: _check_prompt})
_OTHER_PARSERS: Mapping[ApiPath, _Parser] = MappingProxyType({
    ApiPath.RESPONSES: _parse_responses,
    ApiPath.EMBEDDINGS: _parse_whole(_check_embeddings),
    ApiPath.TOKENIZE: _parse_whole(_check_tokenize),
    ApiPath.DETOKENIZE: _parse_whole(_check_detokenize),
    ApiPath.SCORE: _parse_whole(_check_score),
    ApiPath.SCORE_V1: _parse_whole(_check_score),
    ApiPath.RERANK: _parse_whole(_check_rerank),
    ApiPath.RERANK_V1: _parse_whole(_check_rerank),
    ApiPath.RERANK_V2: _parse_whole(_check_rerank),
})
