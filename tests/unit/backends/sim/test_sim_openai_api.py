"""Request validation and response shapes, per dialect."""

from __future__ import annotations

import json

import pytest

from backends.sim import shapes
from backends.sim.behaviour import SGLANG, VLLM
from backends.sim.openai_api import (
    ApiError,
    ModelInfo,
    parse_chat,
    parse_completion,
    parse_responses,
    responses_messages,
)

INFO = ModelInfo(("smollm2-135m",), 2048)
CHAT = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "hello"}]}


def test_chat_defaults_and_stream_options() -> None:
    gen = parse_chat(
        {**CHAT, "stream": True, "stream_options": {"include_usage": True}}, VLLM, INFO
    )
    assert gen.stream and gen.include_usage and not gen.continuous_usage
    assert gen.max_tokens == 2048 - gen.prompt_tokens  # chat default: the rest of the context
    assert gen.prompt_tokens == len(gen.prompt) // 4


def test_max_completion_tokens_wins_and_completion_default_is_16() -> None:
    assert (
        parse_chat({**CHAT, "max_tokens": 9, "max_completion_tokens": 5}, VLLM, INFO).max_tokens
        == 5
    )
    assert parse_completion({"model": "smollm2-135m", "prompt": "hi"}, VLLM, INFO).max_tokens == 16


def test_vllm_rejects_an_unknown_model_and_sglang_echoes_it() -> None:
    with pytest.raises(ApiError) as err:
        parse_chat({**CHAT, "model": "nope"}, VLLM, INFO)
    assert err.value.status == 404 and err.value.err_type == "NotFoundError"
    assert err.value.message == "The model `nope` does not exist."
    assert parse_chat({**CHAT, "model": "nope"}, SGLANG, INFO).model == "nope"


def test_context_length_errors_use_the_engine_words() -> None:
    long_prompt = {"model": "smollm2-135m", "prompt": "x" * 4 * 2000}
    with pytest.raises(ApiError) as err:
        parse_completion({**long_prompt, "max_tokens": 100}, VLLM, INFO)
    assert err.value.status == 400 and err.value.err_type == "BadRequestError"
    assert err.value.message == (
        "'max_tokens' or 'max_completion_tokens' is too large: 100. This model's maximum context "
        "length is 2048 tokens and your request has 2000 input tokens (100 > 2048 - 2000)."
    )
    with pytest.raises(ApiError) as err:
        parse_completion({"prompt": "x" * 4 * 3000}, VLLM, INFO)
    assert err.value.message.startswith(
        "This model's maximum context length is 2048 tokens. "
        "However, your request has 3000 input tokens."
    )
    with pytest.raises(ApiError) as err:
        parse_completion({**long_prompt, "max_tokens": 100}, SGLANG, INFO)
    assert "You requested a total of 2100 tokens" in err.value.message


@pytest.mark.parametrize(
    "extra",
    [{"n": 2}, {"max_tokens": 0}, {"stream_options": {"include_usage": True}}, {"stream": "yes"}],
)
def test_bad_parameters_are_400(extra: dict[str, object]) -> None:
    with pytest.raises(ApiError) as err:
        parse_chat({**CHAT, **extra}, VLLM, INFO)
    assert err.value.status == 400


def test_error_bodies() -> None:
    err = ApiError(400, "bad", "max_tokens")
    assert shapes.error_body(VLLM, err) == {
        "error": {"message": "bad", "type": "BadRequestError", "param": "max_tokens", "code": 400}
    }
    assert shapes.error_body(SGLANG, err) == {
        "object": "error",
        "message": "bad",
        "type": "BadRequestError",
        "param": "max_tokens",
        "code": 400,
    }


def test_vllm_chat_chunks() -> None:
    head = shapes.head("chatcmpl-1", 7, "m")
    role = shapes.chunk(VLLM, "chat", head, None, role=True)
    assert role == {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 7,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
    }
    last = shapes.chunk(VLLM, "chat", head, " end", "length")
    assert last["choices"][0] == {
        "index": 0,
        "delta": {"content": " end"},
        "logprobs": None,
        "finish_reason": "length",
        "stop_reason": None,
    }
    use = shapes.usage(VLLM, 10, 3, drop_none=True)
    assert shapes.usage_chunk(VLLM, "chat", head, use) == {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 7,
        "model": "m",
        "choices": [],
        "usage": {"prompt_tokens": 10, "total_tokens": 13, "completion_tokens": 3},
    }
    assert shapes.sse(use).startswith(b'data: {"prompt_tokens":10,') and shapes.sse(use).endswith(
        b"\n\n"
    )


def test_sglang_chunks_and_responses_carry_its_fields() -> None:
    head = shapes.head("abc", 7, "m")
    c = shapes.chunk(SGLANG, "completion", head, " a")
    assert c["usage"] is None and c["choices"][0]["matched_stop"] is None
    body = shapes.response(SGLANG, "chat", head, " a b", "stop", shapes.usage(SGLANG, 1, 2))
    assert body["object"] == "chat.completion" and body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["reasoning_tokens"] == 0
    json.dumps(body)


def test_models_list() -> None:
    body = shapes.models_body(VLLM, INFO, 5, "modelperm-x")
    card = body["data"][0]
    assert body["object"] == "list" and card["id"] == "smollm2-135m"
    assert card["owned_by"] == "vllm" and card["max_model_len"] == 2048 and card["permission"]
    assert "permission" not in shapes.models_body(SGLANG, INFO, 5, "p")["data"][0]


# -- the Responses API -------------------------------------------------------------------------


def test_a_responses_request_is_the_chat_request_of_the_same_turns() -> None:
    body = {"model": "smollm2-135m", "instructions": "Be brief.", "input": "hello",
            "max_output_tokens": 7, "stream": True}
    gen = parse_responses(body, VLLM, INFO)
    as_chat = parse_chat({"model": "smollm2-135m", "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]},
        VLLM, INFO)
    assert (gen.kind, gen.prompt, gen.max_tokens, gen.stream) == ("chat", as_chat.prompt, 7, True)
    assert parse_responses({**body, "max_output_tokens": None}, VLLM, INFO).max_tokens == (
        2048 - gen.prompt_tokens)


def test_responses_items_become_messages() -> None:
    items = [{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "look"}]},
        {"type": "function_call_output", "call_id": "c", "output": "rain"}]
    messages = responses_messages({"input": items})
    assert messages[0] == {"role": "user", "content": items[0]["content"]}
    assert messages[1]["role"] == "tool" and "rain" in messages[1]["content"]


@pytest.mark.parametrize("body", [
    {"model": "smollm2-135m"}, {"model": "smollm2-135m", "input": []},
    {"model": "smollm2-135m", "input": ["x"]}, {"model": "smollm2-135m", "input": "x",
                                               "max_output_tokens": 0},
])
def test_bad_responses_requests_are_400s(body: dict[str, object]) -> None:
    with pytest.raises(ApiError) as err:
        parse_responses(body, VLLM, INFO)
    assert err.value.status == 400


def test_a_declared_adapter_is_a_served_name_listed_with_its_parent() -> None:
    info = ModelInfo(("smollm2-135m",), 2048, (("sql-lora", "/adapters/sql"),))
    assert parse_chat({**CHAT, "model": "sql-lora"}, VLLM, info).model == "sql-lora"
    with pytest.raises(ApiError) as caught:
        parse_chat({**CHAT, "model": "other-lora"}, VLLM, info)
    assert caught.value.status == 404
    cards = {c["id"]: c for c in shapes.models_body(VLLM, info, 1, "p")["data"]}
    assert cards["smollm2-135m"]["parent"] is None
    lora = cards["sql-lora"]
    assert (lora["parent"], lora["root"], lora["max_model_len"]) == (
        "smollm2-135m", "/adapters/sql", None)
    assert lora["object"] == "model" and lora["owned_by"] == "vllm" and lora["permission"]
