"""Speculative decoding with a draft model in the simulator: how many drafts one verify pass
accepts.

For draft-model methods (EAGLE, EAGLE-3, Medusa, MTP, a draft model) acceptance is a fact of
the pool's draft and target models: a per-position curve α_1..α_K, α_i the chance draft i is
accepted once drafts 1..i−1 were (the per-position acceptance vLLM reports,
``vllm:spec_decode_num_accepted_tokens_per_pos`` ÷ ``vllm:spec_decode_num_drafts``, is the
running product α_1·…·α_i). A verify pass accepts drafts in order until the first rejection,
so the accepted count A satisfies P(A ≥ i) = α_1·…·α_i, and a pass emits A + 1 tokens. With a
constant α this is the fleet arithmetic's truncated geometric law
(:func:`routing.formulas.accepted_pmf`; E[A + 1] = (1 − α^(K+1)) / (1 − α)). A curve shorter
than K repeats its last value. n-gram speculation has no curve: its drafts are checked against
the text (:mod:`backends.sim.ngram`).

Parameters: ``curve`` (α_i in [0, 1), i = 1..), ``k`` (drafts verified in the pass, ≥ 0).
"""

from __future__ import annotations

import random
from collections.abc import Sequence


def sample_accepted(rng: random.Random, curve: Sequence[float], k: int) -> int:
    """Draw A, the number of accepted draft tokens (0..K), from the per-position curve."""
    accepted = 0
    while accepted < k and curve:
        if rng.random() >= curve[min(accepted, len(curve) - 1)]:
            break
        accepted += 1
    return accepted


def position_rates(curve: Sequence[float], k: int) -> list[float]:
    """P(A ≥ i) for i = 1..k: the fraction of verify passes that accept draft i (what vLLM's
    per-position counter divided by its drafts counter reports)."""
    rates, running = [], 1.0
    for i in range(k):
        running *= curve[min(i, len(curve) - 1)] if curve else 0.0
        rates.append(running)
    return rates
