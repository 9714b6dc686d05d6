from __future__ import annotations

import json
import sys

import pytest

from gateway.request.body import MAX_JSON_DEPTH, MAX_TOKENS, ApiPath, parse_request
from gateway.server.errors import GatewayError


def parse(api_path: ApiPath, payload: object) -> object:
    return parse_request(api_path, json.dumps(payload).encode())


def test_chat_fields_are_read_and_the_body_kept() -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}],
                       "stream": True, "stream_options": {"include_usage": True},
                       "max_tokens": 7, "user": "u", "tools": [{"type": "function"}]}).encode()
    req = parse_request(ApiPath.CHAT, body)
    assert (req.model, req.stream, req.include_usage, req.max_tokens, req.user) == (
        "m", True, True, 7, "u")
    assert req.body is body


def test_include_usage_only_counts_for_streams() -> None:
    req = parse_request(ApiPath.CHAT, json.dumps({
        "model": "m", "messages": [{"role": "user"}], "stream_options": {"include_usage": True},
    }).encode())
    assert req.include_usage is False


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    req = parse_request(ApiPath.COMPLETIONS, json.dumps({
        "model": "m", "prompt": "p", "max_tokens": 5, "max_completion_tokens": 9}).encode())
    assert req.max_tokens == 9


@pytest.mark.parametrize("prompt", ["p", ["a", "b"], [1, 2, 3], [[1, 2], [3]]])
def test_valid_prompts(prompt: object) -> None:
    parse(ApiPath.COMPLETIONS, {"model": "m", "prompt": prompt})


@pytest.mark.parametrize(
    ("api_path", "payload", "param", "code"),
    [
        (ApiPath.CHAT, {"messages": [{"role": "u"}]}, "model", "missing_required_parameter"),
        (ApiPath.CHAT, {"model": "", "messages": [{"role": "u"}]}, "model", "invalid_type"),
        (ApiPath.CHAT, {"model": "m", "messages": []}, "messages", "invalid_type"),
        (ApiPath.CHAT, {"model": "m", "messages": [1]}, "messages[0]", "invalid_type"),
        (ApiPath.CHAT, {"model": "m", "messages": [{"role": "u"}], "stream": 1}, "stream",
         "invalid_type"),
        (ApiPath.CHAT, {"model": "m", "messages": [{"role": "u"}], "max_tokens": True},
         "max_tokens", "invalid_type"),
        (ApiPath.CHAT, {"model": "m", "messages": [{"role": "u"}], "user": 5}, "user",
         "invalid_type"),
        (ApiPath.CHAT, {"model": "m", "messages": [{"role": "u"}], "stream_options": []},
         "stream_options", "invalid_type"),
        (ApiPath.COMPLETIONS, {"model": "m", "prompt": []}, "prompt", "invalid_type"),
        (ApiPath.COMPLETIONS, {"model": "m", "prompt": [True]}, "prompt", "invalid_type"),
        (ApiPath.COMPLETIONS, {"model": "m", "prompt": None}, "prompt", "invalid_type"),
    ],
)
def test_bad_fields_are_named(api_path: ApiPath, payload: object, param: str,
                              code: str) -> None:
    with pytest.raises(GatewayError) as info:
        parse(api_path, payload)
    assert (info.value.status, info.value.param, info.value.code) == (400, param, code)
    assert info.value.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("body", [b"", b"  ", b"{", b"\xff\xfe", b"[]", b"null", b'"s"',
                                  b"{}x", b"{} []"])
def test_bodies_that_are_not_json_objects(body: bytes) -> None:
    with pytest.raises(GatewayError) as info:
        parse_request(ApiPath.CHAT, body)
    assert (info.value.status, info.value.param, info.value.code) == (400, None, "invalid_json")


HEAD = b'{"model":"m","messages":[{"role":"user","content":"x"}],"extra":'


@pytest.mark.parametrize("body", [
    HEAD + b"[" * 5000 + b"]" * 5000 + b"}",  # past the parser's own recursion limit
    HEAD + b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1) + b"}",
    HEAD + b'{"a":' * MAX_JSON_DEPTH + b"1" + b"}" * MAX_JSON_DEPTH + b"}",
    HEAD + b"9" * 5000 + b"}",  # an integer longer than Python converts
])
def test_hostile_json_is_a_400_not_a_crash(body: bytes) -> None:
    with pytest.raises(GatewayError) as info:
        parse_request(ApiPath.CHAT, body)
    assert (info.value.status, info.value.code) == (400, "invalid_json")


@pytest.mark.parametrize("body", [
    HEAD + b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1) + b"}",  # just within
    HEAD + b'"' + b"[{" * 500 + b'"}',  # brackets inside a string are not nesting
    HEAD + b"[" + b"[1]," * 200 + b"[1]]}",  # many brackets, shallow
])
def test_bracket_rich_bodies_within_the_depth_limit_pass(body: bytes) -> None:
    assert parse_request(ApiPath.CHAT, body).model == "m"


@pytest.mark.parametrize("value", [0, -1, MAX_TOKENS + 1, 10**40])
def test_max_tokens_out_of_range(value: int) -> None:
    with pytest.raises(GatewayError) as info:
        parse(ApiPath.CHAT, {"model": "m", "messages": [{"role": "user", "content": "x"}],
                              "max_tokens": value})
    assert (info.value.status, info.value.param) == (400, "max_tokens")


# -- the other APIs ----------------------------------------------------------------------------


def test_a_responses_stream_carries_its_usage_and_is_sent_as_is() -> None:
    body = json.dumps({"model": "m", "input": [{"role": "user", "content": "x"}],
                       "instructions": "be brief", "stream": True, "max_output_tokens": 12,
                       "user": "u"}).encode()
    req = parse_request(ApiPath.RESPONSES, body)
    assert (req.api_path, req.stream, req.include_usage, req.max_tokens, req.user) == (
        ApiPath.RESPONSES, True, True, 12, "u")
    assert req.body is body


@pytest.mark.parametrize(("api_path", "payload"), [
    (ApiPath.EMBEDDINGS, {"input": "x"}),
    (ApiPath.EMBEDDINGS, {"input": ["x", "y"], "stream": True}),
    (ApiPath.EMBEDDINGS, {"input": [[1, 2], [3]]}),
    (ApiPath.EMBEDDINGS, {"messages": [{"role": "user", "content": "x"}]}),
    (ApiPath.TOKENIZE, {"prompt": "x"}),
    (ApiPath.TOKENIZE, {"messages": [{"role": "user", "content": "x"}]}),
    (ApiPath.DETOKENIZE, {"tokens": [1, 2, 3]}),
    (ApiPath.DETOKENIZE, {"tokens": []}),
    (ApiPath.SCORE, {"queries": "q", "documents": ["a", "b"]}),
    (ApiPath.SCORE_V1, {"text_1": ["q"], "text_2": ["a"]}),
    (ApiPath.SCORE, {"data_1": "q", "data_2": "a"}),
    (ApiPath.RERANK, {"query": "q", "documents": ["a"]}),
    (ApiPath.RERANK_V1, {"query": "q", "documents": "a", "top_n": 1}),
    (ApiPath.RERANK_V2, {"query": "q", "documents": ["a"]}),
])
def test_the_apis_that_generate_nothing_are_read_whole(api_path: ApiPath,
                                                        payload: dict[str, object]) -> None:
    req = parse_request(api_path, json.dumps({"model": "m", **payload}).encode())
    assert (req.api_path, req.model, req.stream, req.include_usage, req.max_tokens) == (
        api_path, "m", False, False, None)


@pytest.mark.parametrize(
    ("api_path", "payload", "param", "code"),
    [
        (ApiPath.RESPONSES, {"model": "m"}, "input", "missing_required_parameter"),
        (ApiPath.RESPONSES, {"model": "m", "input": ""}, "input", "invalid_type"),
        (ApiPath.RESPONSES, {"model": "m", "input": ["x"]}, "input[0]", "invalid_type"),
        (ApiPath.RESPONSES, {"model": "m", "input": "x", "instructions": 1}, "instructions",
         "invalid_type"),
        (ApiPath.RESPONSES, {"model": "m", "input": "x", "max_output_tokens": 0},
         "max_output_tokens", "invalid_value"),
        (ApiPath.RESPONSES, {"model": "m", "input": "x", "stream": "yes"}, "stream",
         "invalid_type"),
        (ApiPath.EMBEDDINGS, {"input": "x"}, "model", "missing_required_parameter"),
        (ApiPath.EMBEDDINGS, {"model": "m"}, "input", "missing_required_parameter"),
        (ApiPath.EMBEDDINGS, {"model": "m", "input": 3}, "input", "invalid_type"),
        (ApiPath.EMBEDDINGS, {"model": "m", "messages": []}, "messages", "invalid_type"),
        (ApiPath.TOKENIZE, {"model": "m"}, "prompt", "missing_required_parameter"),
        (ApiPath.TOKENIZE, {"model": "m", "prompt": [1]}, "prompt", "invalid_type"),
        (ApiPath.DETOKENIZE, {"model": "m"}, "tokens", "missing_required_parameter"),
        (ApiPath.DETOKENIZE, {"model": "m", "tokens": [1, -2]}, "tokens", "invalid_type"),
        (ApiPath.SCORE, {"model": "m", "queries": "q"}, "queries",
         "missing_required_parameter"),
        (ApiPath.SCORE_V1, {"model": "m", "queries": "q", "documents": []}, "documents",
         "invalid_type"),
        (ApiPath.RERANK, {"model": "m", "documents": ["a"]}, "query",
         "missing_required_parameter"),
        (ApiPath.RERANK_V2, {"model": "m", "query": "q", "documents": {}}, "documents",
         "invalid_type"),
        (ApiPath.RERANK_V1, {"model": "m", "query": "q", "documents": ["a"], "user": 1},
         "user", "invalid_type"),
    ],
)
def test_bad_fields_of_the_other_apis_are_named(api_path: ApiPath, payload: object,
                                                param: str, code: str) -> None:
    with pytest.raises(GatewayError) as info:
        parse(api_path, payload)
    assert (info.value.status, info.value.param, info.value.code) == (400, param, code)


def test_every_api_is_parsed() -> None:
    for api_path in ApiPath:
        with pytest.raises(GatewayError) as info:
            parse(api_path, {"model": "m"})
        assert info.value.code == "missing_required_parameter"


def test_a_member_is_added_to_the_body_bytes_without_encoding_it_again() -> None:
    body = b'{"model": "m",\n "messages": [{"role": "user", "content": "caf\\u00e9"}]} \n'
    req = parse_request(ApiPath.CHAT, body)
    added = req.with_member("stream_options", {"include_usage": True})
    assert added.body == (b'{"model": "m",\n "messages": [{"role": "user", "content": '
                          b'"caf\\u00e9"}],"stream_options": {"include_usage": true}}')
    assert json.loads(added.body) == added.payload == {
        **req.payload, "stream_options": {"include_usage": True}}
    assert "stream_options" not in req.payload  # the original request is untouched


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-32"])
def test_a_body_not_in_plain_utf8_is_encoded_again_with_the_member(encoding: str) -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user"}]}).encode(encoding)
    added = parse_request(ApiPath.CHAT, body).with_member("stream", True)
    assert added.body == json.dumps(added.payload).encode()
    assert json.loads(added.body) == {"model": "m", "messages": [{"role": "user"}],
                                      "stream": True}


def test_a_member_already_in_the_request_is_not_added_twice() -> None:
    req = parse_request(ApiPath.CHAT, json.dumps(
        {"model": "m", "messages": [{"role": "user"}], "stream": True}).encode())
    with pytest.raises(ValueError, match="stream"):
        req.with_member("stream", False)


@pytest.mark.parametrize(("body", "message"), [
    (b'{"model": "m",', "request body is not valid JSON (at line 1, column 15)"),
    (b'{"model": "m"} {"model": "n"}', "request body is not valid JSON (at line 1, column 16)"),
    (b'{"model": "caf\xe9"}',
     "request body is not valid UTF-8 text (byte 0xe9 at offset 14); send UTF-8 JSON"),
    (b'{"model": "m", "n": ' + b"9" * 5000 + b"}",
     f"request body has an integer of more than {sys.get_int_max_str_digits()} digits"),
])
def test_a_body_that_does_not_decode_is_named_in_ridges_words(body: bytes, message: str) -> None:
    with pytest.raises(GatewayError) as info:
        parse_request(ApiPath.CHAT, body)
    assert info.value.body()["error"]["message"] == message


@pytest.mark.parametrize("body", [
    b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}',
    b'{"model": "m", "messages": [{"role": "user", "content": "x"}]} \r\n\t',  # white after
    b' {"model": "m", "messages": [{"role": "user", "content": "x"}]}',  # json.loads's path
    '{"model": "m", "messages": [{"role": "user", "content": "x"}]}'.encode("utf-16"),
])
def test_a_json_object_parses_whichever_way_it_is_read(body: bytes) -> None:
    assert parse_request(ApiPath.CHAT, body).payload == {
        "model": "m", "messages": [{"role": "user", "content": "x"}]}
