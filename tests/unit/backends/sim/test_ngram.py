"""n-gram drafting as vLLM's NgramProposer does it, checked against a direct re-statement of
its algorithm (the longest suffix n-gram with an earlier occurrence, the earliest one)."""

from __future__ import annotations

import random

import pytest

from backends.sim.ngram import NgramIndex, accepted_drafts


def reference(seq: list[str], min_n: int, max_n: int, k: int) -> list[str]:
    """vLLM's ``_find_longest_matched_ngram_and_propose_tokens``, by brute force."""
    end = len(seq)
    for n in range(min(max_n, end - 1), min_n - 1, -1):
        suffix = seq[end - n:]
        for start in range(0, end - n):  # earliest first; the suffix itself excluded
            if seq[start:start + n] == suffix:
                return seq[start + n:min(start + n + k, end)]
    return []


def propose(seq: list[str], min_n: int = 2, max_n: int = 4, k: int = 4) -> list[str]:
    index = NgramIndex(min_n, max_n)
    index.extend(seq)
    return index.propose(k)


def test_worked_example() -> None:
    seq = ["a", "b", "c", "d", "e", "a", "b", "c"]
    # suffix "a b c" (n = 3) occurred at 0..3: propose what followed, up to K = 4
    assert propose(seq) == ["d", "e", "a", "b"]
    # no n-gram of length ≥ 2 repeats: no drafts, a plain decode step
    assert propose(["a", "b", "c", "d"]) == []
    # a repeat of length 1 is below min_n = 2
    assert propose(["a", "b", "c", "a"]) == []
    assert propose(["a", "b", "c", "a"], min_n=1) == ["b", "c", "a"]


def test_the_earliest_occurrence_of_the_longest_ngram_wins() -> None:
    seq = ["x", "y", "1", "q", "x", "y", "2", "r", "s", "x", "y"]
    assert propose(seq, k=2) == ["1", "q"]  # "x y" first at 0, then 4: the earliest
    seq = ["p", "x", "y", "1", "x", "y", "2", "p", "x", "y"]
    assert propose(seq, k=2) == ["1", "x"]  # "p x y" (n = 3) beats the earlier "x y"


@pytest.mark.parametrize("seed", range(30))
def test_incremental_index_equals_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    vocab = [str(i) for i in range(rng.choice((2, 3, 5, 12)))]
    index, seq = NgramIndex(2, 4), []
    for _ in range(120):
        new = [rng.choice(vocab) for _ in range(rng.randint(1, 3))]
        index.extend(new)
        seq.extend(new)
        assert index.propose(4) == reference(seq, 2, 4, 4), seq


def test_acceptance_is_the_matching_run_of_drafts() -> None:
    assert accepted_drafts(["a", "b", "c"], ["a", "b", "x"]) == 2
    assert accepted_drafts(["a", "b"], ["z", "b"]) == 0
    assert accepted_drafts([], ["a"]) == 0
    assert accepted_drafts(["a", "b", "c"], ["a", "b"]) == 2


def test_invalid_window() -> None:
    with pytest.raises(ValueError):
        NgramIndex(3, 2)
