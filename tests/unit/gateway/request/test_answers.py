"""gateway.request.answers: what passes as a whole answer, and what ends a stream."""

from __future__ import annotations

import random

import pytest

from gateway.request.answers import (
    CUT_SHORT,
    EMPTY,
    MEMBER,
    NOT_THE_API,
    broken_whole,
    chat_stream_ended,
    responses_stream_ended,
)
from gateway.request.body import ApiPath

CHAT = b'{"id": "x", "choices": [{"message": {"content": "hi"}}], "usage": {}}'


@pytest.mark.parametrize(("api", "body", "why"), [
    (ApiPath.CHAT, CHAT, None),
    (ApiPath.CHAT, b"  \n" + CHAT + b"\n", None),
    (ApiPath.CHAT, b"", EMPTY),
    (ApiPath.CHAT, b" \r\n ", EMPTY),
    (ApiPath.CHAT, CHAT[:40], CUT_SHORT),
    (ApiPath.CHAT, b'{"object": "chat.completion"}', NOT_THE_API),
    (ApiPath.CHAT, b"[1, 2]", NOT_THE_API),
    (ApiPath.CHAT, b"<html>502</html>", NOT_THE_API),
    (ApiPath.COMPLETIONS, b'{"choices": []}', None),
    (ApiPath.RESPONSES, b'{"id": "r", "output": [], "usage": {}}', None),
    (ApiPath.RESPONSES, CHAT, NOT_THE_API),
    (ApiPath.EMBEDDINGS, b'{"data": [{"embedding": [0.1]}]}', None),
    (ApiPath.RERANK_V2, b'{"results": []}', None),
    (ApiPath.TOKENIZE, b'{"count": 1, "tokens": [1]}', None),
    (ApiPath.DETOKENIZE, b'{"prompt": "a"}', None),
])
def test_a_whole_answer_is_an_object_holding_its_apis_member(api: ApiPath, body: bytes,
                                                            why: str | None) -> None:
    assert broken_whole(api, body) == why


def test_outer_white_space_is_what_bytes_strip_takes() -> None:
    """The check reads the body in place: the same verdicts as on ``body.strip()``."""
    rng = random.Random(3)
    pieces = [b" ", b"\t", b"\n", b"\r", b"\x0b", b"\x0c", b"\x00", b"\xa0", b"{", b"}",
              b'"choices"', b"x"]
    for _ in range(5_000):
        body = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
        text = body.strip()
        member = MEMBER[ApiPath.CHAT]
        want = EMPTY if not text else NOT_THE_API if text[:1] != b"{" else \
            CUT_SHORT if text[-1:] != b"}" else None if member in text else NOT_THE_API
        assert broken_whole(ApiPath.CHAT, body) == want, body


def test_every_api_names_its_member() -> None:
    assert all(broken_whole(api, b'{"x": 1}') == NOT_THE_API for api in ApiPath)


@pytest.mark.parametrize(("region", "ended"), [
    (b'data: {"choices": []}\n\ndata: [DONE]\n\n', True),
    (b"data: [DONE]\n\n", True),
    (b"data:[DONE]\r\n\r\n", True),
    (b'data: {"choices": [{"delta": {"content": "[DONE]"}}]}\n\n', False),  # generated text
    (b'data: {"choices": [{"delta": {"content": "\\ndata: [DONE]"}}]}\n\n', False),
    (b'data: {"choices": []}\n\n', False),
    (b'data: {"content": "[DONE]"}\n\ndata: [DONE]\n\n', True),  # the last one found
    (b'data: [DONE]\n\ndata: {"content": "x [DONE]"}\n\n', True),  # an earlier one
    (b'event: x\ndata: [DONE]\n\n', True),
    (b'xdata: [DONE]\n\n', False),
])
def test_a_chat_stream_ends_with_done_outside_any_string(region: bytes, ended: bool) -> None:
    assert chat_stream_ended(region) is ended


@pytest.mark.parametrize(("region", "ended"), [
    (b'event: response.completed\ndata: {"type":"response.completed","response":{}}\n\n', True),
    (b'event: response.failed\ndata: {"type": "response.failed"}\n\n', True),
    (b'event: response.incomplete\ndata: {"type":"response.incomplete"}\n\n', True),
    (b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
     b'"delta":"\\"type\\":\\"response.completed\\""}\n\n', False),  # generated text
    (b'event: response.created\ndata: {"type":"response.created"}\n\n', False),
])
def test_a_responses_stream_ends_with_its_last_event(region: bytes, ended: bool) -> None:
    assert responses_stream_ended(region) is ended
