"""The simulator's embeddings, score, rerank, tokenize and detokenize: deterministic answers in
vLLM's shapes."""

from __future__ import annotations

import base64
import math
import struct

import pytest

from backends.sim import tokens
from backends.sim.behaviour import SGLANG, VLLM
from backends.sim.openai_api import ApiError, ModelInfo, parse_chat
from backends.sim.pooling import (
    EMBEDDING_DIMS,
    detokenize,
    embedding,
    embeddings,
    relevance,
    rendered,
    rerank,
    score,
    token_id,
    token_text,
    tokenize,
)

INFO = ModelInfo(("m",), 2048)


@pytest.mark.parametrize("text", ["What is the capital of France?", "a", "", "café au lait"])
def test_tokenize_counts_as_the_engine_bills_and_detokenize_gives_the_text_back(
        text: str) -> None:
    answer = tokenize({"model": "m", "prompt": text}, VLLM, INFO)
    assert answer["count"] == len(answer["tokens"]) == tokens.estimate_tokens(text)
    assert answer["max_model_len"] == 2048 and answer["token_strs"] is None
    assert detokenize({"model": "m", "tokens": answer["tokens"]}, VLLM, INFO) == {
        "prompt": text}


def test_tokens_of_other_scripts_are_stable_but_not_reversible() -> None:
    chunk = "日本語の"
    assert token_id(chunk) == token_id(chunk) >= 2**32 and token_text(token_id(chunk)) == "\ufffd"
    assert token_text(token_id("Hi\0\0")) == "Hi"


def test_tokenize_renders_chat_messages_with_the_template() -> None:
    messages = [{"role": "user", "content": "hello"}]
    answer = tokenize({"model": "m", "messages": messages, "return_token_strs": True}, VLLM,
                      INFO)
    assert answer["count"] == tokens.estimate_tokens(tokens.render_chat(messages))
    assert "".join(answer["token_strs"]) == tokens.render_chat(messages).rstrip("\0")


def test_vllm_refuses_a_model_it_does_not_serve() -> None:
    with pytest.raises(ApiError) as err:
        tokenize({"model": "other", "prompt": "x"}, VLLM, INFO)
    assert err.value.status == 404
    assert tokenize({"model": "other", "prompt": "x"}, SGLANG, INFO)["count"] == 1


def test_embeddings_are_unit_vectors_seeded_by_model_and_text() -> None:
    answer = embeddings({"model": "m", "input": ["one", "two", "one"]}, VLLM, INFO, "id", 5)
    vectors = [d["embedding"] for d in answer["data"]]
    assert [len(v) for v in vectors] == [EMBEDDING_DIMS] * 3
    assert all(math.isclose(math.fsum(x * x for x in v), 1.0) for v in vectors)
    assert vectors[0] == vectors[2] != vectors[1] and vectors[0] != embedding("n", "one", 64)
    assert (answer["id"], answer["object"], answer["created"], answer["model"]) == (
        "embd-id", "list", 5, "m")
    assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] == 3
    assert answer["usage"]["completion_tokens"] == 0


def test_embeddings_in_base64_are_little_endian_float32() -> None:
    answer = embeddings({"model": "m", "input": "x", "encoding_format": "base64",
                         "dimensions": 8}, VLLM, INFO, "id", 0)
    raw = base64.b64decode(answer["data"][0]["embedding"])
    assert struct.unpack("<8f", raw) == pytest.approx(embedding("m", "x", 8), abs=1e-6)


@pytest.mark.parametrize("body", [
    {"model": "m"}, {"model": "m", "input": []}, {"model": "m", "input": [{"a": 1}]},
    {"model": "m", "input": "x", "dimensions": 0}, {"model": "m", "input": "x",
                                                   "encoding_format": "bytes"},
])
def test_bad_embeddings_requests_are_400s(body: dict[str, object]) -> None:
    with pytest.raises(ApiError) as err:
        embeddings(body, VLLM, INFO, "id", 0)
    assert err.value.status == 400


def test_token_ids_and_chat_messages_are_embedded_too() -> None:
    by_ids = embeddings({"model": "m", "input": [[1, 2], [3]]}, VLLM, INFO, "id", 0)
    assert len(by_ids["data"]) == 2
    chat = embeddings({"model": "m", "messages": [{"role": "user", "content": "x"}]}, VLLM,
                      INFO, "id", 0)
    assert len(chat["data"]) == 1


def test_relevance_is_the_share_of_the_querys_words_held() -> None:
    assert relevance("capital of France", "Paris is the capital of France.") == 1.0
    assert relevance("capital of France", "France") == pytest.approx(1 / 3)
    assert relevance("", "anything") == 0.0


def test_score_pairs_one_query_with_each_document_or_two_lists_item_by_item() -> None:
    one = score({"model": "m", "queries": "red apple", "documents": ["red", "green", "apple red"]},
                VLLM, INFO, "s", 1)
    assert [d["score"] for d in one["data"]] == [0.5, 0.0, 1.0]
    assert one["id"] == "score-s" and one["data"][0]["object"] == "score"
    pairwise = score({"model": "m", "text_1": ["a", "b"], "text_2": ["a", "a"]}, VLLM, INFO,
                     "s", 1)
    assert [d["score"] for d in pairwise["data"]] == [1.0, 0.0]
    with pytest.raises(ApiError):
        score({"model": "m", "data_1": ["a", "b"], "data_2": ["a", "b", "c"]}, VLLM, INFO, "s", 1)
    with pytest.raises(ApiError):
        score({"model": "m", "queries": "a"}, VLLM, INFO, "s", 1)


def test_rerank_sorts_by_relevance_stably_and_keeps_top_n() -> None:
    body = {"model": "m", "query": "red apple", "documents": ["green", "red", "red apple", "red"]}
    ranked = rerank(body, VLLM, INFO, "r")
    assert [r["index"] for r in ranked["results"]] == [2, 1, 3, 0]
    assert ranked["results"][0]["document"] == {"text": "red apple", "multi_modal": None}
    assert ranked["usage"]["prompt_tokens"] == ranked["usage"]["total_tokens"] > 0
    assert [r["index"] for r in rerank({**body, "top_n": 2}, VLLM, INFO, "r")["results"]] == [
        2, 1]
    with pytest.raises(ApiError):
        rerank({**body, "top_n": -1}, VLLM, INFO, "r")


def test_rendered_is_vllms_generate_request_for_the_validated_request() -> None:
    messages = [{"role": "user", "content": "hello"}]
    gen = parse_chat({"model": "m", "messages": messages, "max_tokens": 5, "stream": True,
                      "stream_options": {"include_usage": True}}, VLLM, INFO)
    body = {"model": "m", "stream_options": {"include_usage": True}, "priority": 2}
    answer = rendered(gen, [7, 8, 9], "chatcmpl-x", body)
    assert answer["request_id"] == "chatcmpl-x" and answer["token_ids"] == [7, 8, 9]
    assert answer["model"] == "m" and answer["stream"] is True and answer["priority"] == 2
    assert answer["stream_options"] == {"include_usage": True}
    assert answer["sampling_params"]["max_tokens"] == 5 and answer["features"] is None
    plain = rendered(parse_chat({"messages": messages}, VLLM, INFO), [1], "r", {})
    assert plain["stream"] is False and plain["stream_options"] is None
    assert plain["model"] is None and plain["priority"] == 0  # as the request left them
    # no max_tokens: what the context leaves after the prompt, as vLLM's get_max_tokens
    prompt = tokens.estimate_tokens(tokens.render_chat(messages))
    assert plain["sampling_params"]["max_tokens"] == INFO.max_context - prompt
