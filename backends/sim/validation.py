"""Request bodies checked the way vLLM 0.32's OpenAI server checks them, and its error texts.

The bodies (:data:`BODIES`: :class:`ChatBody`, :class:`CompletionBody`,
:class:`ResponsesBody`) are vLLM's own pydantic models cut down to the fields the simulator
honours, with vLLM's types, defaults and field order, validated in pydantic's lax mode, so the
same errors come in the same order; chat messages are checked against the names of vLLM's
message union (:data:`MESSAGE_UNION`).

:func:`render_errors` writes them as vLLM does: a count line, at most :data:`MAX_REPORTED`
errors, each input bounded (:data:`MAX_INPUT_CHARS`) and each line cut
(:data:`MAX_LINE_CHARS`). A body that is not JSON, empty or ``null`` fails as pydantic does.
See docs/simulator.md#validation.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

BodyKind = Literal["chat", "completion", "responses"]
ErrorDict = dict[str, Any]

MAX_REPORTED = 10  # errors listed in one message
MAX_INPUT_CHARS = 200  # characters of an offending value echoed back
MAX_LINE_CHARS = 1000  # characters of one error's line
INTERNAL_MARKERS = frozenset({
    "function-wrap", "function-after", "function-before", "function-plain", "json-or-python",
    "lax-or-strict", "chain", "default", "nullable", "tagged-union", "union", "call",
    "arguments", "is-instance", "is-subclass", "callable", "str", "int", "float", "bool", "bytes",
    "bytearray", "list", "tuple", "dict", "set", "frozenset", "complex", "none", "nonetype",
})  # fmt: skip
"""pydantic's schema-kind names that vLLM drops from ``loc`` (``_INTERNAL_LOC_MARKERS``)."""

MESSAGE_UNION: tuple[tuple[str, str, str], ...] = (
    ("ChatCompletionDeveloperMessageParam", "dict_type", "Input should be a valid dictionary"),
    ("ChatCompletionSystemMessageParam", "dict_type", "Input should be a valid dictionary"),
    ("ChatCompletionUserMessageParam", "dict_type", "Input should be a valid dictionary"),
    ("ChatCompletionAssistantMessageParam", "dict_type", "Input should be a valid dictionary"),
    ("ChatCompletionToolMessageParam", "dict_type", "Input should be a valid dictionary"),
    ("ChatCompletionFunctionMessageParam", "dict_type", "Input should be a valid dictionary"),
    ("CustomChatCompletionMessageParam", "dict_type", "Input should be a valid dictionary"),
    ("Message", "model_attributes_type",
     "Input should be a valid dictionary or object to extract fields from"),
)
"""vLLM's ``ChatCompletionMessageParam`` union, in order: each branch's name and the error it
gives a message that is not an object (typed dicts: ``dict_type``; the ``Message`` model:
``model_attributes_type``)."""

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
Seed = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
TokenId = Annotated[int, Field(ge=0)]


class _Body(BaseModel):
    """vLLM's ``OpenAIBaseModel``: other fields are accepted; a non-object body is
    ``model_attributes_type``."""

    model_config = ConfigDict(extra="allow", from_attributes=True)


class StreamOptions(_Body):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class ChatBody(_Body):
    """``ChatCompletionRequest``'s honoured fields, in its order."""

    messages: list[Any]
    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int | None = 1
    seed: Seed | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    min_tokens: int = 0


class CompletionBody(_Body):
    """``CompletionRequest``'s honoured fields, in its order."""

    model: str | None = None
    prompt: list[TokenId] | list[list[TokenId]] | str | list[str] | None = None
    max_tokens: int | None = 16
    n: int = 1
    seed: Seed | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    min_tokens: int = 0


class ResponsesBody(_Body):
    """``ResponsesRequest``'s honoured fields, in its order (``input`` items: any object)."""

    input: str | list[Any]
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str | None = None
    stream: bool | None = False
    seed: Seed | None = None


BODIES: Mapping[BodyKind, type[_Body]] = MappingProxyType(
    {"chat": ChatBody, "completion": CompletionBody, "responses": ResponsesBody}
)


class BodyInvalid(ValueError):
    """A body vLLM's pydantic models refuse; ``errors`` as FastAPI hands them over."""

    def __init__(self, errors: Sequence[ErrorDict]) -> None:
        super().__init__(f"{len(errors)} validation errors")
        self.errors = list(errors)


class BodyUnreadable(ValueError):
    """A body FastAPI cannot decode at all (not UTF-8): its plain 400, :data:`UNREADABLE`."""


UNREADABLE = "There was an error parsing the body"


def parse_json(raw: bytes) -> Any:
    """The JSON document of a request body; :class:`BodyInvalid` as FastAPI reports a body that
    is empty, ``null`` or not JSON, :class:`BodyUnreadable` for bytes that are no text."""
    if not raw:  # FastAPI reads no body at all; whitespace is JSON that fails to parse
        raise BodyInvalid([_missing_body()])
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise BodyInvalid([{"type": "json_invalid", "loc": ("body", exc.pos),
                            "msg": "JSON decode error", "input": {},
                            "ctx": {"error": exc.msg}}]) from None
    except UnicodeDecodeError:
        raise BodyUnreadable(UNREADABLE) from None
    if doc is None:
        raise BodyInvalid([_missing_body()])
    return doc


def json_object(doc: Any) -> dict[str, Any]:
    """``doc`` if it is a JSON object; else :class:`BodyInvalid` as every vLLM body model
    refuses another value (``model_attributes_type`` at ``body``)."""
    if isinstance(doc, dict):
        return doc
    raise BodyInvalid([{"type": "model_attributes_type", "loc": ("body",),
                        "msg": "Input should be a valid dictionary or object to extract fields "
                               "from", "input": doc}])


def _missing_body() -> ErrorDict:
    return {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}


def validate_body(kind: BodyKind, body: Any) -> dict[str, Any]:
    """The honoured fields of ``body`` as vLLM's model coerces them (every field, defaults
    filled in); :class:`BodyInvalid` with every error, in vLLM's order."""
    try:
        values = BODIES[kind].model_validate(body)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise BodyInvalid([*_message_errors(kind, body), *errors]) from None  # messages first
    message_errors = _message_errors(kind, body)
    if message_errors:
        raise BodyInvalid(message_errors)
    fields = type(values).model_fields
    return {name: getattr(values, name) for name in fields}


def _message_errors(kind: BodyKind, body: Any) -> list[ErrorDict]:
    """One error per branch of :data:`MESSAGE_UNION` for each chat message that is no object."""
    if kind != "chat" or not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return []
    return [
        {"type": kind_, "loc": ("body", "messages", i, branch), "msg": msg, "input": item}
        for i, item in enumerate(body["messages"])
        if not isinstance(item, dict)
        for branch, kind_, msg in MESSAGE_UNION
    ]


# -- vLLM's rendering ---------------------------------------------------------------------------


def summarise_input(value: Any) -> Any:
    """An offending value as vLLM echoes it: a string cut at :data:`MAX_INPUT_CHARS`, a
    container described (``<list of 3 items>``), anything else its ``str``."""
    if isinstance(value, str):
        return value[:MAX_INPUT_CHARS] + "...[truncated]" if len(value) > MAX_INPUT_CHARS else value
    if isinstance(value, (bytes, bytearray)):
        return f"<{type(value).__name__} of {len(value)} bytes>"
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = str(value)
    return text[:MAX_INPUT_CHARS] + "...[truncated]" if len(text) > MAX_INPUT_CHARS else text


def clean_loc(loc: Sequence[Any]) -> str:
    """``loc`` joined by dots without pydantic's internal segments (bracketed ones such as
    ``list[str]`` and :data:`INTERNAL_MARKERS`)."""
    parts = [str(p) for p in loc if not _internal(str(p))]
    return ".".join(parts) if parts else ".".join(str(p) for p in loc)


def _internal(segment: str) -> bool:
    return any(c in segment for c in "[]{}()") or segment.lower() in INTERNAL_MARKERS


def format_error(error: ErrorDict) -> str:
    """One error's line: its dict with a bounded ``input`` and a dotted ``loc``."""
    shown = dict(error)
    if "input" in shown:
        shown["input"] = summarise_input(shown["input"])
    shown["loc"] = clean_loc(tuple(shown["loc"]))
    text = str(shown)
    return text[:MAX_LINE_CHARS] + "...[truncated]" if len(text) > MAX_LINE_CHARS else text


def render_errors(errors: Sequence[ErrorDict]) -> tuple[str, str | None]:
    """vLLM's message and ``param`` for ``errors`` (module docstring)."""
    label = "error" if len(errors) == 1 else "errors"
    lines = [f"{len(errors)} validation {label}:"]
    lines += [f"  {format_error(e)}" for e in errors[:MAX_REPORTED]]
    if len(errors) > MAX_REPORTED:
        lines.append(f"  ...and {len(errors) - MAX_REPORTED} more {label}")
    param = clean_loc(tuple(errors[0]["loc"])) if errors else None
    return sanitize("\n".join(lines)), param


SANITIZERS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r" at 0x[0-9a-fA-F]+>"), ">"),
    (re.compile(r'\n?\s*File "[^"]+", line \d+, in \S+(\n\s+.*)?'), ""),
    (re.compile(r"/(?:home|usr|opt|var|tmp|root|lib|mnt|srv)(?:/[\w.\-]+)+"), "<path>"),
    (re.compile(r"(?:/[\w\-]+)+/[\w\-]+\.\w+"), "<path>"),
)
"""vLLM's ``sanitize_message``: memory addresses, traceback lines and file paths, replaced."""


def sanitize(message: str) -> str:
    """``message`` as vLLM sends it: :data:`SANITIZERS` applied, then stripped."""
    for pattern, replacement in SANITIZERS:
        message = pattern.sub(replacement, message)
    return message.strip()
