"""n-gram speculative decoding as vLLM's ``NgramProposer`` drafts: prompt look-up over the text.

After each sampled token, find the longest n (``min_n`` ≤ n ≤ ``max_n``) whose last n tokens
also occur earlier in the sequence (prompt + output), take that n-gram's earliest occurrence
and propose the at most K tokens that followed it; none found, no drafts. With greedy sampling
a draft is accepted exactly when it equals the answer's token (:func:`accepted_drafts`), so
acceptance follows from the text.

:class:`NgramIndex` keeps, per n, each n-gram's earliest end position, extended as tokens are
appended, so a proposal costs O(max_n − min_n + 1) look-ups instead of vLLM's scan, with the
same answer. Parameters: ``min_n``, ``max_n`` [tokens], ``k`` (draft tokens per step).
See docs/simulator.md#n-gram-drafting.
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
