from __future__ import annotations

import json
import os
import subprocess
import sys
from array import array
from pathlib import Path
from typing import Any

import pytest
import xxhash

from routing.features import (
    FeatureConfig,
    FeatureExtractor,
    RequestFeatures,
    RequestInfo,
    block_hashes,
    canonical_prompt,
    extract_features,
    part_digest,
    token_block_hashes,
)
from routing.tokens.counters import CharEstimate

ROOT = Path(__file__).resolve().parents[3]
SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 10}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def chat(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"messages": list(messages), **extra}


# --- canonical prompt ------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("shorter", "longer"),
    [
        (chat(SYSTEM, user("hi")),
         chat(SYSTEM, user("hi"), {"role": "assistant", "content": "hello"}, user("more"))),
        (chat(SYSTEM, tools=TOOLS), chat(SYSTEM, user("weather?"), tools=TOOLS)),
        (chat(SYSTEM, user("look"), {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]}),
         chat(SYSTEM, user("look"), {"role": "assistant", "content": None, "tool_calls": [
             {"id": "c1", "type": "function",
              "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
              {"role": "tool", "tool_call_id": "c1", "content": "rain"})),
    ],
    ids=["history", "tools-first", "tool-result"],
)
def test_a_continued_conversation_extends_the_canonical_prompt(
    shorter: dict[str, Any], longer: dict[str, Any]
) -> None:
    short, long = canonical_prompt(shorter, "chat"), canonical_prompt(longer, "chat")
    assert long.startswith(short) and len(long) > len(short)
    short_hashes, long_hashes = block_hashes(short, 64), block_hashes(long, 64)
    assert short_hashes and long_hashes[: len(short_hashes)] == short_hashes


@pytest.mark.parametrize(
    ("a", "b"),
    [
        # the whole history counts, not only the first message
        (chat(SYSTEM, user("question one")), chat(SYSTEM, user("question two"))),
        (chat(SYSTEM, user("x"), tools=TOOLS), chat(SYSTEM, user("x"))),
        (chat(user("same text")), chat({"role": "assistant", "content": "same text"})),
        (chat({"role": "user", "content": [{"type": "text", "text": "see"}, IMAGE]}),
         chat({"role": "user", "content": [{"type": "text", "text": "see"},
                                           {**IMAGE, "image_url": {"url": "data:other"}}]})),
        (chat({"role": "assistant", "content": None, "tool_calls": [{"id": "1", "function": {
            "name": "f", "arguments": "{\"a\":1}"}}]}),
         chat({"role": "assistant", "content": None, "tool_calls": [{"id": "1", "function": {
             "name": "f", "arguments": "{\"a\":2}"}}]})),
        (chat({"role": "tool", "tool_call_id": "1", "content": "sunny"}),
         chat({"role": "tool", "tool_call_id": "1", "content": "rain"})),
        (chat(user("ab"), user("c")), chat(user("a"), user("bc"))),  # message boundaries count
    ],
    ids=["later-message", "tools", "role", "image", "tool-call", "tool-result", "boundaries"],
)
def test_different_requests_give_different_canonical_prompts(
    a: dict[str, Any], b: dict[str, Any]
) -> None:
    assert canonical_prompt(a, "chat") != canonical_prompt(b, "chat")


def test_tools_come_first_so_system_and_tools_form_the_shared_prefix() -> None:
    text = canonical_prompt(chat(SYSTEM, user("q"), tools=TOOLS), "chat")
    assert text.index("get_weather") < text.index("careful assistant") < text.index("q\x03")


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (chat(user("x"), tools=[{"type": "function", "function": {"name": "f", "strict": True}}]),
         chat(user("x"), tools=[{"function": {"strict": True, "name": "f"}, "type": "function"}])),
        (chat({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}),
         chat({"content": [{"image_url": {"url": "u"}, "type": "image_url"}], "role": "user"})),
        (chat(user("x"), temperature=0.1, stream=True), chat(user("x"))),  # sampling ignored
    ],
    ids=["tool-key-order", "part-key-order", "sampling-params"],
)
def test_the_canonical_prompt_ignores_key_order_and_sampling(
    a: dict[str, Any], b: dict[str, Any]
) -> None:
    assert canonical_prompt(a, "chat") == canonical_prompt(b, "chat")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("plain", "\x02user\x1fplain\x03"),
        (None, "\x02user\x1f\x03"),
        ([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "\x02user\x1fab\x03"),
        ([{"type": "text", "text": "a"}, IMAGE],
         "\x02user\x1fa\x1a" + part_digest(IMAGE) + "\x03"),
    ],
)
def test_message_content_forms(content: Any, expected: str) -> None:
    assert canonical_prompt(chat({"role": "user", "content": content}), "chat") == expected


def test_a_part_digest_is_64_bits_of_xxh3_over_sorted_json() -> None:
    dumped = json.dumps(IMAGE, sort_keys=True, separators=(",", ":"))
    assert part_digest(IMAGE) == xxhash.xxh3_64_hexdigest(dumped.encode())


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("once upon", "once upon"),
        (["once upon"], "once upon"),
        (["a", "b"], "a\x00b"),
        ([1, 2, 300], "ids:1 2 300"),
        ([[1, 2], [3]], "ids:1 2\x00ids:3"),
        (None, ""),
        ({"odd": 1}, "{\"odd\":1}"),
    ],
)
def test_completion_prompts(prompt: Any, expected: str) -> None:
    assert canonical_prompt({"prompt": prompt}, "completions") == expected


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="embeddings"):
        canonical_prompt({}, "embeddings")


# --- block hashes ----------------------------------------------------------------------------

@pytest.mark.parametrize(("chars", "blocks"), [(0, 0), (63, 0), (64, 1), (127, 1), (128, 2),
                                               (8192, 128)])
def test_only_full_blocks_are_hashed(chars: int, blocks: int) -> None:
    assert len(block_hashes("x" * chars, 64)) == blocks


PINNED = (3305025233846988428, 16731173407106305370)  # "a" × 64 + "b" × 64, no seed


def test_block_hashes_are_chained_xxh3_with_pinned_values() -> None:
    hashes = block_hashes("a" * 64 + "b" * 64, 64)
    # pinned: the same on every process, platform and release (gateways share them)
    assert hashes == PINNED
    assert hashes[0] == xxhash.xxh3_64_intdigest(b"a" * 64, 0)
    assert hashes[1] == xxhash.xxh3_64_intdigest(b"b" * 64, hashes[0])  # seeded by block 0
    assert block_hashes("b" * 64, 64)[0] != hashes[1]  # block 1's hash covers block 0 too
    seeded = xxhash.xxh3_64_intdigest(b"a" * 64, xxhash.xxh3_64_intdigest(b"m"))
    assert block_hashes("a" * 64, 64, seed="m") == (seeded,)


def test_non_ascii_blocks_are_characters_encoded() -> None:
    text = "é" * 64 + "b" * 64  # 128 characters, 192 bytes
    hashes = block_hashes(text, 64)
    assert len(hashes) == 2
    assert hashes[0] == xxhash.xxh3_64_intdigest(("é" * 64).encode(), 0)
    assert hashes[1] == xxhash.xxh3_64_intdigest(b"b" * 64, hashes[0])


def test_block_hashes_do_not_depend_on_the_process_hash_seed() -> None:
    code = "from routing.features import block_hashes; print(block_hashes('é' * 200, 64))"
    runs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
        for seed in ("1", "2")
    }
    assert runs == {repr(block_hashes("é" * 200, 64)) + "\n"}


def test_the_default_block_is_16_tokens_of_4_characters() -> None:
    assert FeatureConfig().block_chars == 64
    assert FeatureConfig(block_tokens=128).block_chars == 512


# --- extraction -------------------------------------------------------------------------------

def features(payload: dict[str, Any], kind: str = "chat", **info: Any) -> RequestFeatures:
    return extract_features(payload, RequestInfo(kind, "m", **info), FeatureConfig(),
                            CharEstimate())


@pytest.mark.parametrize(
    ("payload", "info", "expected"),
    [
        (chat(user("x")), {"max_tokens": 50}, 50),
        (chat(user("x"), max_completion_tokens=70), {}, 70),
        (chat(user("x"), max_tokens=80), {}, 80),
        (chat(user("x"), max_tokens=80), {"max_tokens": 5}, 5),
        (chat(user("x"), max_tokens=True), {}, 256),  # not an integer
        (chat(user("x")), {"learned_output_tokens": 123.6}, 124),
        (chat(user("x")), {"learned_output_tokens": 0.2}, 1),
        (chat(user("x")), {"max_tokens": 9, "learned_output_tokens": 123.6}, 9),
        (chat(user("x")), {}, 256),
    ],
)
def test_expected_output_tokens(payload: dict[str, Any], info: dict[str, Any],
                                expected: int) -> None:
    assert features(payload, **info).expected_output_tokens == expected


@pytest.mark.parametrize(
    ("payload", "hint", "expected"),
    [
        (chat(user("x"), user="alice"), None, "alice"),
        (chat(user("x"), user="alice"), "conv-7", "conv-7"),
        (chat(user("x")), "conv-7", "conv-7"),
        (chat(user("x"), user=""), "", None),
        (chat(user("x"), user=42), None, None),
        (chat(user("x")), None, None),
    ],
)
def test_session_key(payload: dict[str, Any], hint: str | None, expected: str | None) -> None:
    digest = None if expected is None else xxhash.xxh3_64_hexdigest(expected.encode())
    assert features(payload, session_hint=hint).session == digest


def test_a_huge_session_hint_becomes_a_small_key() -> None:
    session = features(chat(user("x")), session_hint="s" * 1_000_000).session
    assert session is not None and len(session) == 16


@pytest.mark.parametrize(
    ("payload", "kind", "prompt_tokens", "block_tokens", "blocks"),
    [
        ({"prompt": "x" * 1000}, "completions", 250, 16, 15),  # ceil(1000/4); 1000 // 64
        ({"prompt": "x" * 10}, "completions", 3, 16, 0),
        # token ids count exactly; their text "ids:1000 1001 ... 1099" is 4 + 100·4 + 99 = 503
        # characters: 7 full blocks, each 64 × 100 / 503 ≈ 12.7 → 13 tokens
        ({"prompt": list(range(1000, 1100))}, "completions", 100, 13, 7),
        ({"prompt": [[1, 2, 3], [4]]}, "completions", 4, 16, 0),
    ],
)
def test_prompt_and_block_tokens(payload: dict[str, Any], kind: str, prompt_tokens: int,
                                 block_tokens: int, blocks: int) -> None:
    got = features(payload, kind)
    assert (got.prompt_tokens, got.block_tokens) == (prompt_tokens, block_tokens)
    assert len(got.block_hashes) == blocks


def test_features_carry_the_request_fields() -> None:
    got = features(chat(user("x" * 200)), stream=True, max_tokens=7)
    assert (got.model, got.stream, got.max_tokens) == ("m", True, 7)
    assert got.block_hashes == block_hashes(canonical_prompt(chat(user("x" * 200)), "chat"),
                                            64, seed="m")


@pytest.mark.parametrize(("blocks", "expected"), [(0, 0), (2, 32), (3, 40), (-1, 0)])
def test_matched_tokens_are_blocks_times_block_tokens_capped_at_the_prompt(
    blocks: int, expected: int
) -> None:
    got = RequestFeatures("m", (1, 2), 16, 40, 10, None, None, False)
    assert got.matched_tokens(blocks) == expected


@pytest.mark.parametrize(
    ("max_tokens", "learned", "expected"),
    [(None, 300.4, 300), (None, None, 99), (20, 300.4, 20)],
)
def test_the_extractor_uses_the_models_counter_and_the_learned_output(
    max_tokens: int | None, learned: float | None, expected: int
) -> None:
    class Fixed:
        def count(self, text: str) -> int:
            return 1234

    extractor = FeatureExtractor(FeatureConfig(block_tokens=8, default_output_tokens=99),
                                 {"m": Fixed()})
    payload = chat(user("y" * 400))
    got = extractor.extract(payload, RequestInfo("chat", "m", max_tokens, False, None, learned))
    assert (got.prompt_tokens, got.expected_output_tokens) == (1234, expected)
    assert len(got.block_hashes) == len(canonical_prompt(payload, "chat")) // 32
    other = extractor.extract(payload, RequestInfo("chat", "other"))  # no counter: the estimate
    assert other.prompt_tokens == -(-len(canonical_prompt(payload, "chat")) // 4)


@pytest.mark.parametrize("bad", [{"block_tokens": 0}, {"chars_per_token": 0},
                                 {"default_output_tokens": 0}])
def test_feature_config_refuses_non_positive_values(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        FeatureConfig(**bad)


# --- the Responses API's input ---------------------------------------------------------------

def test_a_responses_request_reads_as_the_chat_request_with_the_same_turns() -> None:
    system = SYSTEM["content"]
    as_chat = canonical_prompt(chat(SYSTEM, user("hi")), "chat")
    assert canonical_prompt({"instructions": system, "input": "hi"}, "responses") == as_chat
    items = [{"type": "message", "role": "user", "id": "msg_1", "status": "completed",
              "content": [{"type": "input_text", "text": "h"}, {"type": "text", "text": "i"}]}]
    assert canonical_prompt({"instructions": system, "input": items}, "responses") == as_chat


def test_a_continued_responses_conversation_extends_its_canonical_prompt() -> None:
    first = [user("look")]
    later = [*first,
             {"type": "function_call", "call_id": "c1", "name": "get_weather",
              "arguments": "{\"city\":\"Oslo\"}"},
             {"type": "function_call_output", "call_id": "c1", "output": "rain"},
             {"role": "assistant", "content": [{"type": "output_text", "text": "Rain."}]}]
    shorter = canonical_prompt({"tools": TOOLS, "input": first}, "responses")
    longer = canonical_prompt({"tools": TOOLS, "input": later}, "responses")
    assert longer.startswith(shorter) and len(longer) > len(shorter)
    assert "function_call_output" in longer and "rain" in longer and "Rain." in longer


def test_responses_parts_other_than_text_are_digests() -> None:
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    one = canonical_prompt({"input": [{"role": "user", "content": [image]}]}, "responses")
    other = canonical_prompt({"input": [{"role": "user", "content": [
        {**image, "image_url": "data:image/png;base64,BBBB"}]}]}, "responses")
    assert part_digest(image) in one and one != other and "AAAA" not in one


def test_responses_features_share_blocks_with_the_same_chat_and_count_max_output() -> None:
    config = FeatureConfig(block_tokens=4, chars_per_token=1.0)
    system = "x" * 40
    as_chat = extract_features(chat({"role": "system", "content": system}, user("hi")),
                               RequestInfo("chat", "m"), config, CharEstimate(1.0))
    responses = extract_features({"instructions": system, "input": "hi"},
                                 RequestInfo("responses", "m", max_tokens=30), config,
                                 CharEstimate(1.0))
    assert responses.block_hashes == as_chat.block_hashes != ()
    assert responses.expected_output_tokens == 30
    extractor = FeatureExtractor(config)
    cached = extractor.extract({"instructions": system, "input": "hi"},
                               RequestInfo("responses", "m"))
    assert cached.block_hashes == responses.block_hashes  # the lead cache gives the same hashes


# --- exact prompt tokens: token-id blocks ----------------------------------------------------

def test_token_block_hashes_chain_full_blocks_of_little_endian_ids() -> None:
    seed = xxhash.xxh3_64_intdigest(b"m")
    first = xxhash.xxh3_64_intdigest(bytes([1, 0, 0, 0, 2, 1, 0, 0]), seed)  # ids 1, 258
    second = xxhash.xxh3_64_intdigest(bytes([3, 0, 0, 0, 4, 0, 0, 0]), first)
    assert token_block_hashes([1, 258, 3, 4, 5], 2, "m") == (first, second)  # 5: partial
    assert token_block_hashes(array("I", [1, 258, 3, 4]), 2, "m") == (first, second)
    assert token_block_hashes([1], 2, "m") == ()
    with pytest.raises(ValueError):
        token_block_hashes([1], 0)


class FixedIds:
    """Exact prompt ids: the same for every request, None for completions."""

    def prompt_ids(self, payload: Any, kind: str) -> list[int] | None:
        return list(range(40)) if kind == "chat" else None


def test_exact_ids_give_the_count_and_token_blocks_else_the_text_path() -> None:
    config = FeatureConfig(block_tokens=16)
    exact = extract_features(chat(user("hi")), RequestInfo("chat", "m"), config,
                             CharEstimate(), exact=FixedIds())
    assert exact.prompt_tokens == 40 and exact.block_tokens == 16
    assert exact.block_hashes == token_block_hashes(range(40), 16, "m")
    text = extract_features({"prompt": "x" * 80}, RequestInfo("completions", "m"), config,
                            CharEstimate(), exact=FixedIds())
    assert text.prompt_tokens == 20 and text.block_hashes == block_hashes("x" * 80, 64, "m")
