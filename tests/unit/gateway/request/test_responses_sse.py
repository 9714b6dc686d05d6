"""The Responses API stream scanner: bytes relayed untouched, deltas timed, the closing
event's usage read in the chat API's names."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from backends.upstream.client import UpstreamStreamError
from gateway.request.responses_sse import ResponsesScanner, chat_usage

USAGE = {"input_tokens": 11, "input_tokens_details": {"cached_tokens": 4},
         "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 0},
         "total_tokens": 14}


def event(kind: str, **fields: Any) -> bytes:
    """One event as vLLM writes it: ``event:`` line, compact JSON ``data:`` line."""
    data = json.dumps({**fields, "type": kind}, separators=(",", ":"))
    return f"event: {kind}\ndata: {data}\n\n".encode()


def response(status: str, text: str | None, usage: dict[str, Any] | None) -> dict[str, Any]:
    output = [] if text is None else [{"id": "msg_1", "content": [
        {"annotations": [], "text": text, "type": "output_text"}], "role": "assistant",
        "status": "completed", "type": "message"}]
    return {"id": "resp_1", "object": "response", "output": output, "status": status,
            "usage": usage, "user": None}


def delta(text: str) -> bytes:
    return event("response.output_text.delta", content_index=0, delta=text, item_id="msg_1",
                 logprobs=[], output_index=0)


STREAM = [
    event("response.created", response=response("in_progress", None, None)),
    event("response.in_progress", response=response("in_progress", None, None)),
    event("response.output_item.added", item={"id": "msg_1", "content": []}, output_index=0),
    event("response.content_part.added", part={"text": "", "type": "output_text"}),
    delta("Hel"), delta("lo"), delta("!"),
    event("response.output_text.done", text="Hello!"),
    event("response.content_part.done", part={"text": "Hello!", "type": "output_text"}),
    event("response.output_item.done", item={"content": [{"text": "Hello!"}]}),
    event("response.completed", response=response("completed", "Hello!", USAGE)),
]


def ticks(step: float = 0.5) -> Iterator[float]:
    n = 0.0
    while True:
        yield n
        n += step


def test_a_stream_is_relayed_byte_for_byte_and_timed_by_its_deltas() -> None:
    clock = ticks()
    scanner = ResponsesScanner(True, lambda: next(clock))
    relayed = b"".join(scanner.feed(e) for e in STREAM) + scanner.rest()
    assert relayed == b"".join(STREAM)  # nothing cut, though strip_usage was asked
    assert scanner.token_events == 3  # the deltas; the *.done events repeat the text
    assert scanner.first_token_at == 0.0 and scanner.gaps == [0.5, 0.5]  # read per delta
    assert scanner.usage == {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14,
                             "prompt_tokens_details": {"cached_tokens": 4}}
    assert scanner.completion_tokens == 3


def test_events_split_anywhere_are_held_back_to_a_boundary() -> None:
    whole = b"".join(STREAM)
    scanner = ResponsesScanner(False, lambda: 0.0)
    pieces = [scanner.feed(whole[i:i + 7]) for i in range(0, len(whole), 7)]
    assert b"".join(pieces) + scanner.rest() == whole
    assert all(p.endswith(b"\n\n") for p in pieces if p)
    assert scanner.token_events == 3 and scanner.completion_tokens == 3


def test_without_a_usage_the_deltas_count_the_tokens() -> None:
    scanner = ResponsesScanner(False, lambda: 0.0)
    for e in STREAM[:-1]:
        scanner.feed(e)
    assert scanner.usage is None and scanner.completion_tokens == 3


@pytest.mark.parametrize("region", [
    event("response.created", response=response("in_progress", None, None)),  # usage null
    delta(""),  # an empty delta is no token
    event("response.output_text.done", text="a whole text"),
])
def test_what_is_not_a_token_nor_a_usage(region: bytes) -> None:
    scanner = ResponsesScanner(False, lambda: 0.0)
    assert scanner.feed(region) == region
    assert (scanner.token_events, scanner.usage) == (0, None)


def test_an_event_past_the_limit_breaks_the_stream() -> None:
    scanner = ResponsesScanner(False, lambda: 0.0, max_event_bytes=64)
    with pytest.raises(UpstreamStreamError):
        scanner.feed(b"event: response.output_text.delta\ndata: " + b"x" * 100)


def test_chat_usage_names() -> None:
    assert chat_usage({"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}) == {
        "prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7,
        "prompt_tokens_details": None}
    chat = {"prompt_tokens": 5, "total_tokens": 5}
    assert chat_usage(chat) is chat
