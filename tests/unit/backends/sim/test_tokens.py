"""Prompt rendering and the token estimate."""

from __future__ import annotations

import random

from backends.sim import tokens


def test_estimate_is_four_characters_per_token_rounded_up() -> None:
    assert tokens.estimate_tokens("") == 0
    assert tokens.estimate_tokens("abcd") == 1
    assert tokens.estimate_tokens("abcde") == 2
    assert len(tokens.stream_tokens("abcde")) == 2


def test_vocabulary_words_are_one_token_each() -> None:
    assert len(tokens.VOCAB) == len(set(tokens.VOCAB)) == 72
    assert all(len(w) == tokens.CHARS_PER_TOKEN and w.startswith(" ") for w in tokens.VOCAB)
    words = tokens.words(random.Random(1), 50)
    assert words == tokens.words(random.Random(1), 50)
    assert tokens.estimate_tokens("".join(words)) == 50


def test_chat_rendering_is_chatml_aligned_to_tokens() -> None:
    text = tokens.render_chat(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    assert text.startswith("<|im_start|>system\n")
    assert "Be brief.<|im_end|>" in text and text.rstrip().endswith("<|im_start|>assistant")
    assert len(text) % tokens.CHARS_PER_TOKEN == 0


def test_next_turn_prompt_extends_prompt_plus_reply() -> None:
    # what makes multi-turn conversations hit the prefix cache on their whole history
    history = [{"role": "user", "content": "Tell me a story"}]
    reply = "".join(tokens.words(random.Random(2), 30))
    first = tokens.render_chat(history)
    second = tokens.render_chat(
        [*history, {"role": "assistant", "content": reply}, {"role": "user", "content": "More"}]
    )
    assert second.startswith(first + reply)
    stream = tokens.stream_tokens(first) + tokens.words(random.Random(2), 30)
    assert tokens.stream_tokens(second)[: len(stream)] == stream


def test_content_parts_and_completion_prompts() -> None:
    parts = [
        {"type": "text", "text": "a"},
        {"type": "image_url", "image_url": {}},
        {"type": "text", "text": "b"},
    ]
    assert tokens.content_text(parts) == "ab"
    assert tokens.completion_prompt_text("x") == "x"
    assert tokens.completion_prompt_text(["x"]) == "x"
    assert tokens.completion_prompt_text([1, 2]) == "00010002"
    assert tokens.completion_prompt_text(["x", "y"]) is None
    assert "tools" in tokens.render_chat([{"role": "user", "content": "q"}], tools=[{"t": 1}])


def test_responses_text_parts_are_text_too() -> None:
    parts = [{"type": "input_text", "text": "a"}, {"type": "input_image", "image_url": "x"},
             {"type": "output_text", "text": "b"}]
    assert tokens.content_text(parts) == "ab"
