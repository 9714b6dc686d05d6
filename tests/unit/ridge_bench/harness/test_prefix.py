"""f over a stream of requests, on worked numbers."""

from __future__ import annotations

import pytest

from ridge_bench.harness.prefix import PrefixTracker, canonical_text, prompt_tokens
from routing.features import block_hashes


def test_block_hashes_are_chained_over_whole_blocks() -> None:
    a = block_hashes("x" * 64 + "y" * 64 + "z" * 10, 64)
    b = block_hashes("x" * 64 + "w" * 64, 64)
    assert len(a) == 2  # the trailing 10 characters are no whole block
    assert a[0] == b[0] and a[1] != b[1]
    assert block_hashes("w" * 64 + "y" * 64, 64)[1] != a[1]  # same block, other prefix


def test_canonical_text_covers_every_message() -> None:
    one = canonical_text([{"role": "system", "content": "S"}, {"role": "user", "content": "a"}])
    two = canonical_text([{"role": "system", "content": "S"}, {"role": "user", "content": "b"}])
    assert one != two and one[:3] == two[:3]


def test_f_on_worked_numbers() -> None:
    """Two requests sharing a 1,000-character system message. Canonical text of each: the
    system message renders as 1 + 6 + 1 + 1000 + 1 = 1,009 characters, the user message as
    1 + 4 + 1 + 200 + 1 = 207, so 1,216 characters = 304 tokens. They share 1,009 + 6 = 1,015
    leading characters (up to the user message's text) = 15 whole 64-character blocks = 240
    tokens. f = 240 / (2 · 304) = 0.3947."""
    system = {"role": "system", "content": "s" * 1000}
    first = [system, {"role": "user", "content": "a" * 200}]
    second = [system, {"role": "user", "content": "b" * 200}]
    assert len(canonical_text(first)) == 1216
    tracker = PrefixTracker()
    assert tracker.observe(first) == 0
    assert tracker.observe(second) == 240
    assert tracker.prompt_tokens == 608
    assert tracker.f == pytest.approx(0.3947, abs=1e-4)


def test_f_of_a_repeated_request_counts_only_whole_blocks() -> None:
    msgs = [{"role": "user", "content": "q" * 630}]
    tracker = PrefixTracker()
    tracker.observe(msgs)
    tracker.observe(msgs)
    text = canonical_text(msgs)
    assert tracker.matched_tokens == (len(text) // 64) * 16
    assert tracker.f == (len(text) // 64) * 16 / (2 * prompt_tokens(text))


def test_f_is_zero_before_any_request() -> None:
    assert PrefixTracker().f == 0.0
