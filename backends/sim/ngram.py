"""n-gram speculative decoding as vLLM's ``NgramProposer`` drafts: prompt look-up over the text.

Algorithm (vLLM 0.32, ``vllm/v1/spec_decode/ngram_proposer.py``,
``_find_longest_matched_ngram_and_propose_tokens``): after each sampled token, take the
sequence so far (prompt + output). Find the longest n, ``min_n`` ≤ n ≤ ``max_n``, whose last
n tokens also occur earlier in the sequence; among the earlier occurrences of that n-gram take
the earliest; propose the (at most K) tokens that followed it, never past the sequence's end.
No such n-gram (or a sequence shorter than ``min_n``): no drafts, and the sequence decodes
one token in that step. With greedy sampling the target model accepts draft i exactly when
it equals the token the model samples there, so acceptance follows from the text: high when
the answer repeats its prompt (a copy task), near zero on free text.

Index (:class:`NgramIndex`): per n, a dict n-gram → the end position of its earliest
occurrence, extended as tokens are appended (O(max_n − min_n + 1) per token), so each
proposal costs O(max_n − min_n + 1) dictionary look-ups instead of vLLM's O(sequence) scan —
the same answer: the earliest occurrence whose end lies before the sequence's end.

Parameters: ``min_n``, ``max_n`` (n-gram lengths [tokens], vLLM's ``prompt_lookup_min`` /
``prompt_lookup_max``); ``k`` (draft tokens per step, the pool's ``num_draft_tokens``).
"""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    """The earliest end position of every n-gram (``min_n`` ≤ n ≤ ``max_n``) of a sequence."""

    __slots__ = ("_min", "_max", "_ends", "_tokens")

    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self._min, self._max = min_n, max_n
        self._ends: dict[int, dict[tuple[str, ...], int]] = {n: {} for n in range(min_n, max_n + 1)}
        self._tokens: list[str] = []

    def extend(self, tokens: Sequence[str]) -> None:
        """Append ``tokens`` to the indexed sequence."""
        seq = self._tokens
        for token in tokens:
            seq.append(token)
            end = len(seq)
            for n, ends in self._ends.items():
                if end >= n:
                    ends.setdefault(tuple(seq[end - n:end]), end)

    def propose(self, k: int) -> list[str]:
        """Up to ``k`` draft tokens for the sequence indexed so far (the module's algorithm)."""
        seq = self._tokens
        end = len(seq)
        for n in range(self._max, self._min - 1, -1):
            if end <= n:
                continue
            first = self._ends[n].get(tuple(seq[end - n:end]))
            if first is not None and first < end:
                return seq[first:min(first + k, end)]
        return []


def accepted_drafts(drafts: Sequence[str], answer: Sequence[str]) -> int:
    """How many leading ``drafts`` equal the tokens the model samples there (``answer``)."""
    count = 0
    for draft, token in zip(drafts, answer, strict=False):
        if draft != token:
            break
        count += 1
    return count
