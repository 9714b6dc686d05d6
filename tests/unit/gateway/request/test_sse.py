"""The stream scanner: bytes relayed untouched (but for the usage chunk ridge asked for on its
own account), token events found by byte search, usage parsed from its one event."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from backends.upstream.client import UpstreamStreamError
from gateway.request.sse import StreamScanner, error_event, token_events


def event(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def chunk(content: str | None = None, finish: str | None = None, *, role: bool = False,
          **delta: Any) -> bytes:
    d: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
    if content is not None:
        d["content"] = content
    d.update(delta)
    return event({"id": "c", "object": "chat.completion.chunk",
                  "choices": [{"index": 0, "delta": d, "finish_reason": finish}]})


USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10,
         "prompt_tokens_details": {"cached_tokens": 4}}
USAGE_EVENT = event({"id": "c", "object": "chat.completion.chunk", "choices": [],
                     "usage": USAGE})
DONE = b"data: [DONE]\n\n"
STREAM = [chunk(role=True), chunk("Hel"), chunk("lo"), chunk("!"), chunk(finish="stop"),
          USAGE_EVENT, DONE]


def ticks(step: float = 0.5) -> Iterator[float]:
    n = 0.0
    while True:
        yield n
        n += step


@pytest.mark.parametrize(("region", "expected"), [
    (chunk(role=True), 0),  # the role chunk: empty content
    (chunk("x"), 1),
    (chunk('"quoted"'), 1),  # escaped quotes: content starts with a backslash
    (chunk(finish="stop"), 0),
    (chunk(reasoning_content="thinking"), 1),
    (chunk(tool_calls=[{"index": 0, "function": {"arguments": "{"}}]), 1),
    (chunk(tool_calls=[]), 0),
    (event({"choices": [{"text": "once", "index": 0}]}), 0),  # a completions key
    (chunk("a") + chunk("b") + chunk(finish="stop"), 2),
    (chunk('the "content":"x" of a quote'), 1),  # inside a string the quotes are escaped
    (USAGE_EVENT + DONE, 0),
    (b'data: {"choices":[{"delta":{"content" : "x"}}]}\n\n', 1),  # json.dumps's spacing
    (b'data: {"choices":[{"delta":{"content":\t\r\n"x"}}]}\n\n', 1),
    (b'data: {"choices":[{"delta":{"content": ""}}]}\n\n', 0),
    (b'data: {"choices":[{"delta":{"tool_calls": [ ]}}]}\n\n', 0),
    (b'data: {"choices":[{"delta":{"tool_calls": [ {"index":0}]}}]}\n\n', 1),
    (b'data: {"choices":[{"delta":{"role":"text"}}]}\n\n', 0),  # a value, not a key
    (b'data: {"choices":[{"delta":{"content":"a"}},{"delta":{"content":"b"}}]}\n\n', 2),
    (b'{"content":"', 1),  # a region may end inside the value it opens
    (b'{"content":', 0),
    (b'data: {"choices":[{"delta":{"xcontent":"a","_reasoning_content":"b"}}]}\n\n', 0),
    (b'content":"a"', 0),  # no opening quote before the region's start
    (b'content"content":"x"', 1),  # keys back to back: the second follows the first's quote
    (b'{"content":"a","reasoning_content":"b","content":""}', 2),
    (b'{"tool_calls":[1],"tool_calls":[],"tool_calls":[2]}', 2),
    (chunk("a", tool_calls=[{"index": 0}]), 2),  # each key opens a token event
])
def test_token_events_by_byte_search(region: bytes, expected: int) -> None:
    assert token_events(region) == expected


@pytest.mark.parametrize(("region", "expected"), [
    (event({"choices": [{"text": "once", "index": 0}]}), 1),
    (event({"choices": [{"text": "", "index": 0}]}), 0),
    (event({"choices": [{"text": "a"}, {"text": "b"}]}) + event({"choices": [{"text": "c"}]}),
     3),
    (b'data: {"choices":[{"text" : "x"}]}\n\n', 1),
    (chunk("x"), 0),  # a chat key
])
def test_a_completions_stream_counts_its_text(region: bytes, expected: int) -> None:
    assert token_events(region, completions=True) == expected


def test_a_completions_scanner_counts_text_events() -> None:
    scanner = StreamScanner(strip_usage=False, completions=True)
    scanner.feed(event({"choices": [{"text": "a", "index": 0}]}))
    assert scanner.token_events == 1


def test_a_stream_passes_through_byte_for_byte_when_the_client_asked_for_usage() -> None:
    scanner = StreamScanner(strip_usage=False, clock=ticks().__next__)
    out = b"".join(scanner.feed(c) for c in STREAM) + scanner.rest()
    assert out == b"".join(STREAM)
    assert scanner.usage == USAGE and scanner.completion_tokens == 3
    assert scanner.token_events == 3


def test_the_usage_chunk_ridge_asked_for_is_cut_out() -> None:
    scanner = StreamScanner(strip_usage=True)
    whole = b"".join(STREAM)
    assert scanner.feed(whole) + scanner.rest() == whole.replace(USAGE_EVENT, b"")
    assert scanner.usage == USAGE


def test_events_split_anywhere_are_relayed_whole_and_counted_once() -> None:
    whole = b"".join(STREAM)
    for cut in range(1, len(whole), 7):
        scanner = StreamScanner(strip_usage=True)
        out = scanner.feed(whole[:cut]) + scanner.feed(whole[cut:]) + scanner.rest()
        assert out == whole.replace(USAGE_EVENT, b""), cut
        assert (scanner.token_events, scanner.usage) == (3, USAGE), cut


def test_only_whole_events_are_relayed_the_tail_waits_for_its_end() -> None:
    scanner = StreamScanner(strip_usage=False)
    first = chunk("a")
    assert scanner.feed(first + b"data: {\"partial") == first
    assert scanner.feed(b'": 1}\n\n') == b'data: {"partial": 1}\n\n'
    assert scanner.feed(b"data: [DO") == b""
    assert scanner.rest() == b"data: [DO"  # an unterminated last event, given at the end


@pytest.mark.parametrize(("piece", "relayed"), [
    (b"data: {}\n\n", b"data: {}\n\n"),
    (b"data: {}\r\n\r\n", b"data: {}\r\n\r\n"),
    (b"data: {}\n\ndata: {}\n", b"data: {}\n\n"),
    (b"data: {}\r\n", b""),
    (b"\n", b""),
    (b"\n\n", b"\n\n"),
    (b"\r\n\r\n", b"\r\n\r\n"),
    (b"data: {}\r\n\n", b"data: {}\r\n\n"),  # a CR LF line end, then a blank line
])
def test_a_piece_is_relayed_up_to_its_last_blank_line(piece: bytes, relayed: bytes) -> None:
    scanner = StreamScanner(strip_usage=False)
    assert scanner.feed(piece) == relayed
    assert scanner.rest() == piece[len(relayed):]


@pytest.mark.parametrize(("pieces", "ended"), [
    (STREAM, True),
    (STREAM[:-1], False),  # broke off before [DONE]
    ([b"".join(STREAM)], True),
    ([*STREAM[:-1], b"data: [DONE]"], True),  # the last event unterminated, held back
    ([*STREAM[:-1], b"data: [DO", b"NE]\n\n"], True),
    ([*STREAM, b"\n"], True),  # a stray line end after the last event
    ([DONE, chunk("x")], False),  # events after [DONE]: it was not the last
    ([chunk("data: [DONE]")], False),  # generated text
    ([], False),
])
def test_a_stream_ended_when_its_last_region_holds_done(pieces: list[bytes], ended: bool) -> None:
    scanner = StreamScanner(strip_usage=True)
    for piece in pieces:
        scanner.feed(piece)
    scanner.rest()
    assert scanner.ended is ended


def test_crlf_terminated_events_are_events_too() -> None:
    scanner = StreamScanner(strip_usage=False)
    body = b'data: {"choices":[{"delta":{"content":"x"}}]}\r\n\r\n'
    assert scanner.feed(body) == body and scanner.token_events == 1


def test_first_token_time_and_gaps() -> None:
    clock = ticks(1.0)
    scanner = StreamScanner(strip_usage=True, clock=clock.__next__)
    scanner.feed(chunk(role=True))  # no token: the clock is not read
    scanner.feed(chunk("a"))  # t = 0
    scanner.feed(chunk("b") + chunk("c"))  # t = 1: two tokens arrived together
    scanner.feed(chunk("d"))  # t = 2
    assert scanner.first_token_at == 0.0
    assert scanner.gaps == [1.0, 0.0, 1.0]
    assert scanner.completion_tokens == 4  # no usage: the token events


def test_a_usage_key_in_an_event_with_choices_is_not_the_usage_chunk() -> None:
    body = event({"choices": [{"delta": {"content": "x"}}], "usage": {"completion_tokens": 9}})
    scanner = StreamScanner(strip_usage=True)
    assert scanner.feed(body) == body and scanner.usage is None


def test_error_event_is_openai_shaped() -> None:
    raw = error_event("gone", "bad_gateway", "upstream_broken")
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    assert json.loads(raw[6:]) == {"error": {"message": "gone", "type": "bad_gateway",
                                             "param": None, "code": "upstream_broken"}}


def test_spaced_json_is_read_the_same() -> None:
    spaced = [b"data: " + json.dumps(json.loads(e[6:])).encode() + b"\n\n" for e in STREAM[:-1]]
    scanner = StreamScanner(strip_usage=True)
    out = b"".join(scanner.feed(e) for e in [*spaced, DONE])
    assert b'"usage"' not in out and scanner.usage == USAGE and scanner.token_events == 3


def test_an_event_that_never_ends_is_refused_past_the_cap() -> None:
    scanner = StreamScanner(strip_usage=False, max_event_bytes=1000)
    assert scanner.feed(b'data: {"x": 1}\n\ndata: "') == b'data: {"x": 1}\n\n'
    assert scanner.feed(b"y" * 900) == b""  # held: still within the cap
    with pytest.raises(UpstreamStreamError, match="exceeds 1000 bytes"):
        scanner.feed(b"y" * 200)
