from __future__ import annotations

import json

from gateway.sse import EventSplitter, StreamObserver, error_event


def test_splitter_returns_whole_events_whatever_the_chunking() -> None:
    stream = b"data: {\"a\": 1}\n\ndata: {\"b\": 2}\r\n\r\ndata: [DONE]\n\n"
    for size in (1, 3, 7, len(stream)):
        splitter = EventSplitter()
        events = [e for i in range(0, len(stream), size) for e in splitter.feed(stream[i:i + size])]
        assert b"".join(events) == stream
        assert events == [b'data: {"a": 1}\n\n', b'data: {"b": 2}\r\n\r\n', b"data: [DONE]\n\n"]
        assert splitter.rest() == b""


def test_splitter_keeps_an_unfinished_event() -> None:
    splitter = EventSplitter()
    assert splitter.feed(b"data: x\n\ndata: y") == [b"data: x\n\n"]
    assert splitter.rest() == b"data: y"


def _chunk(**fields: object) -> bytes:
    return b"data: " + json.dumps(fields).encode() + b"\n\n"


def test_observer_times_the_first_token_not_the_role_chunk() -> None:
    ticks = iter([1.0, 2.0, 3.0])
    obs = StreamObserver(clock=lambda: next(ticks))
    obs.observe(_chunk(choices=[{"delta": {"role": "assistant", "content": ""}}]))
    assert obs.first_token_at is None
    obs.observe(_chunk(choices=[{"delta": {"content": "Hi"}}]))
    obs.observe(_chunk(choices=[{"text": " there"}]))
    assert obs.first_token_at == 1.0 and obs.content_events == 2
    assert obs.completion_tokens == 2  # no usage: counted events


def test_observer_prefers_the_engines_usage() -> None:
    obs = StreamObserver()
    obs.observe(_chunk(choices=[{"delta": {"content": "Hi"}}]))
    obs.observe(_chunk(choices=[], usage={"prompt_tokens": 3, "completion_tokens": 9}))
    obs.observe(b"data: [DONE]\n\n")
    assert obs.completion_tokens == 9 and obs.done


def test_observer_ignores_comments_and_garbage() -> None:
    obs = StreamObserver()
    obs.observe(b": keep-alive\n\n")
    obs.observe(b"data: not json\n\n")
    assert obs.completion_tokens is None and obs.first_token_at is None


def test_error_event_is_openai_shaped() -> None:
    event = error_event("gone", "bad_gateway", "upstream_broken")
    assert event.endswith(b"\n\n")
    body = json.loads(event[len(b"data: "):])
    assert body == {"error": {"message": "gone", "type": "bad_gateway", "param": None,
                              "code": "upstream_broken"}}


def test_observer_flags_usage_only_chunks_and_measures_gaps() -> None:
    ticks = iter([1.0, 1.5, 1.75])
    obs = StreamObserver(clock=lambda: next(ticks))
    assert obs.observe(_chunk(choices=[{"delta": {"content": "a"}}], usage=None)) is False
    assert obs.observe(_chunk(choices=[{"delta": {"content": "b"}}])) is False
    assert obs.observe(_chunk(choices=[{"delta": {"content": "c"}}])) is False
    assert obs.observe(_chunk(choices=[], usage={"completion_tokens": 3})) is True
    assert obs.gaps == [0.5, 0.25]
