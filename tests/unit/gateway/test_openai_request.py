from __future__ import annotations

import json

import pytest

from gateway.errors import GatewayError
from gateway.openai_request import Endpoint, parse_request


def parse(endpoint: Endpoint, payload: object) -> object:
    return parse_request(endpoint, json.dumps(payload).encode())


def test_chat_fields_are_read_and_the_body_kept() -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}],
                       "stream": True, "stream_options": {"include_usage": True},
                       "max_tokens": 7, "user": "u", "tools": [{"type": "function"}]}).encode()
    req = parse_request(Endpoint.CHAT, body)
    assert (req.model, req.stream, req.include_usage, req.max_tokens, req.user) == (
        "m", True, True, 7, "u")
    assert req.body is body


def test_include_usage_only_counts_for_streams() -> None:
    req = parse_request(Endpoint.CHAT, json.dumps({
        "model": "m", "messages": [{"role": "user"}], "stream_options": {"include_usage": True},
    }).encode())
    assert req.include_usage is False


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    req = parse_request(Endpoint.COMPLETIONS, json.dumps({
        "model": "m", "prompt": "p", "max_tokens": 5, "max_completion_tokens": 9}).encode())
    assert req.max_tokens == 9


@pytest.mark.parametrize("prompt", ["p", ["a", "b"], [1, 2, 3], [[1, 2], [3]]])
def test_valid_prompts(prompt: object) -> None:
    parse(Endpoint.COMPLETIONS, {"model": "m", "prompt": prompt})


@pytest.mark.parametrize(
    ("endpoint", "payload", "param", "code"),
    [
        (Endpoint.CHAT, {"messages": [{"role": "u"}]}, "model", "missing_required_parameter"),
        (Endpoint.CHAT, {"model": "", "messages": [{"role": "u"}]}, "model", "invalid_type"),
        (Endpoint.CHAT, {"model": "m", "messages": []}, "messages", "invalid_type"),
        (Endpoint.CHAT, {"model": "m", "messages": [1]}, "messages[0]", "invalid_type"),
        (Endpoint.CHAT, {"model": "m", "messages": [{"role": "u"}], "stream": 1}, "stream",
         "invalid_type"),
        (Endpoint.CHAT, {"model": "m", "messages": [{"role": "u"}], "max_tokens": True},
         "max_tokens", "invalid_type"),
        (Endpoint.CHAT, {"model": "m", "messages": [{"role": "u"}], "user": 5}, "user",
         "invalid_type"),
        (Endpoint.CHAT, {"model": "m", "messages": [{"role": "u"}], "stream_options": []},
         "stream_options", "invalid_type"),
        (Endpoint.COMPLETIONS, {"model": "m", "prompt": []}, "prompt", "invalid_type"),
        (Endpoint.COMPLETIONS, {"model": "m", "prompt": [True]}, "prompt", "invalid_type"),
        (Endpoint.COMPLETIONS, {"model": "m", "prompt": None}, "prompt", "invalid_type"),
    ],
)
def test_bad_fields_are_named(endpoint: Endpoint, payload: object, param: str,
                              code: str) -> None:
    with pytest.raises(GatewayError) as info:
        parse(endpoint, payload)
    assert (info.value.status, info.value.param, info.value.code) == (400, param, code)
    assert info.value.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("body", [b"", b"  ", b"{", b"\xff\xfe", b"[]", b"null", b'"s"'])
def test_bodies_that_are_not_json_objects(body: bytes) -> None:
    with pytest.raises(GatewayError) as info:
        parse_request(Endpoint.CHAT, body)
    assert (info.value.status, info.value.param, info.value.code) == (400, None, "invalid_json")
