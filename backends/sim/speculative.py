"""Speculative decoding: how many tokens one verify pass yields, in expectation and sampled.

Algorithm: a drafter proposes K tokens; the target model verifies all K (plus the position after
them) in one forward pass of 1 + K tokens per sequence. Each draft token is accepted independently
with probability α, in order, until the first rejection; the pass then emits the accepted drafts
plus one token of its own (the correction, or the bonus token when all K were accepted). So the
number of accepted drafts A follows a geometric law truncated at K:

    P(A = a) = α^a · (1 − α)   for 0 ≤ a < K,        P(A = K) = α^K

and the tokens emitted per verify pass are A + 1, with

    E[A + 1] = Σ_{i=0..K} α^i = (1 − α^(K+1)) / (1 − α)            [tokens / pass]   (α < 1)

Drafting costs c·K target-decode-steps' worth of time (c = one draft token's cost relative to a
target decode step, ≈ 0 for n-gram lookup), so the net speed-up over plain decoding is about
E[A + 1] / (1 + c·K) while decode is memory-bound; the verify pass processes (1 + K)× the tokens,
so the gain shrinks as the batch approaches the roofline's ridge (the engine's step time shows it).

Parameters: ``alpha`` (α, per-token acceptance rate in [0, 1)), ``k`` (K ≥ 0 draft tokens),
``draft_cost`` (c ≥ 0).
"""

from __future__ import annotations

import random


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """E[tokens per verify pass] = (1 − α^(K+1)) / (1 − α); K + 1 when α = 1."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def accepted_pmf(alpha: float, k: int) -> list[float]:
    """P(A = a) for a = 0..K: the truncated geometric law of accepted drafts."""
    probs = [alpha**a * (1.0 - alpha) for a in range(k)]
    probs.append(alpha**k)
    return probs


def sample_accepted(rng: random.Random, alpha: float, k: int) -> int:
    """Draw A, the number of accepted draft tokens (0..K), from the truncated geometric law."""
    accepted = 0
    while accepted < k and rng.random() < alpha:
        accepted += 1
    return accepted


def net_speedup(alpha: float, k: int, draft_cost: float) -> float:
    """Memory-bound speed-up over plain decoding ≈ E[A + 1] / (1 + c·K) (dimensionless)."""
    return expected_tokens_per_step(alpha, k) / (1.0 + draft_cost * k)
