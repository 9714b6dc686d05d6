"""The simulated answer: a copy of the passage a request asks to repeat, else fresh words."""

from __future__ import annotations

import random

import pytest

from backends.sim import tokens
from backends.sim.answers import PLAIN, Answer, Style, copy_span


def chat(*turns: tuple[str, str]) -> list[str]:
    return tokens.stream_tokens(tokens.render_chat([{"role": r, "content": c} for r, c in turns]))


PASSAGE = "def add(a, b):\n    return a + b\n"


def test_a_repeat_request_answers_with_its_passage() -> None:
    prompt = chat(("system", "You are terse."),
                  ("user", "Repeat the following code exactly:\n" + PASSAGE))
    span = copy_span(prompt)
    assert span is not None
    copied = "".join(prompt[span[0]:span[1]])
    assert PASSAGE.strip()[:-2] in copied and "Repeat" not in copied and "<|im_end|>" not in copied
    answer = Answer.for_prompt(prompt, random.Random(0), PLAIN)
    assert answer.natural_length() == span[1] - span[0]
    assert answer.tokens(0, span[1] - span[0]) == prompt[span[0]:span[1]]
    # past the passage: fresh words
    assert all(t in tokens.VOCAB for t in answer.tokens(span[1] - span[0], 20))


@pytest.mark.parametrize("turns", [
    [("user", "Tell me about the sea.")],
    # the directive is in an earlier turn, not the last one
    [("user", "Repeat after me: hello"), ("assistant", "hello"), ("user", "Now a poem.")],
    [("system", "Copy: nothing"), ("user", "What is 2 + 2?")],
])
def test_other_requests_answer_with_fresh_words(turns: list[tuple[str, str]]) -> None:
    prompt = chat(*turns)
    assert copy_span(prompt) is None
    answer = Answer.for_prompt(prompt, random.Random(1), PLAIN)
    assert answer.natural_length() is None
    # the same words the engine drew before answers existed: one draw per token
    assert answer.tokens(0, 30) == tokens.words(random.Random(1), 30)


def test_a_completion_prompt_without_markers_is_one_turn() -> None:
    prompt = tokens.stream_tokens("Echo this text: the quick brown fox")
    span = copy_span(prompt)
    assert span is not None and "the quick brown fo" in "".join(prompt[span[0]:span[1]])


def test_slips_replace_a_share_of_the_copied_tokens() -> None:
    passage = " ".join(f"w{i:03d}" for i in range(2000))
    prompt = chat(("user", "Copy this: " + passage))
    answer = Answer.for_prompt(prompt, random.Random(2), Style(slip=0.25))
    span = copy_span(prompt)
    assert span is not None
    n = span[1] - span[0]
    same = sum(a == b for a, b in zip(answer.tokens(0, n), prompt[span[0]:span[1]], strict=True))
    assert same / n == pytest.approx(0.75, abs=0.03)


def test_answers_are_stable_whatever_the_order_they_are_read_in() -> None:
    a, b = Answer(random.Random(5)), Answer(random.Random(5))
    assert a.tokens(0, 3) + a.tokens(3, 7) == b.tokens(0, 10)
    assert a.tokens(2, 4) == b.tokens(2, 4)


def test_run_start_worked_numbers() -> None:
    # share 0.6 in runs of 6: p = 0.6 / (6 · 0.4) = 0.25, i.e. a run every 4 fresh tokens
    assert Style(repeat_share=0.6, repeat_run=6).run_start == pytest.approx(0.25)
    assert Style().run_start == 0.0
    with pytest.raises(ValueError):
        Style(repeat_run=0.5)


def test_free_text_repeats_the_configured_share_of_earlier_text() -> None:
    style = Style(repeat_share=0.6, repeat_run=6)
    continued = total = 0
    for seed in range(60):
        prompt = [f" p{i:03d}" for i in range(50)]  # distinct: a repeat is unmistakable
        out = Answer(random.Random(seed), (), style, prompt).tokens(0, 300)
        seq = prompt + out
        seen = {(seq[i - 1], seq[i]) for i in range(1, len(prompt))}
        for i in range(len(prompt), len(seq)):
            pair = (seq[i - 1], seq[i])
            continued += pair in seen
            seen.add(pair)
        total += len(out)
    # a run's tokens after its first continue an earlier bigram: ≈ 0.6 × 5/6 = 0.5 of the text
    # (plus the odd chance bigram of fresh words)
    assert 0.42 < continued / total < 0.6, continued / total


def test_an_answer_keeps_its_prompt_when_the_callers_list_grows() -> None:
    # the engine's request holds the same list and appends the answer to it
    prompt = [f" p{i:03d}" for i in range(40)]
    style = Style(repeat_share=0.6, repeat_run=6)
    shared, separate = list(prompt), list(prompt)
    a = Answer(random.Random(4), (), style, shared)
    b = Answer(random.Random(4), (), style, separate)
    for start in range(0, 200, 5):
        shared.extend(a.tokens(start, 5))
        assert b.tokens(start, 5) == shared[-5:]
