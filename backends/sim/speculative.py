"""Speculative decoding in the simulator: drawing how many drafts one verify pass accepts.

The law is the fleet arithmetic's (:mod:`routing.fleet_math`): each of the K draft tokens is
accepted independently with probability α, in order, until the first rejection, so the
number of accepted drafts A follows a geometric law truncated at K
(:func:`routing.fleet_math.accepted_pmf`) and a pass emits A + 1 tokens, E[A + 1] =
(1 − α^(K+1)) / (1 − α) (:func:`routing.fleet_math.expected_tokens_per_pass`). The engine loop
draws A per verify pass with :func:`sample_accepted`; drafting time (c·K target-decode steps'
worth) is the engine's.

Parameters: ``alpha`` (α, per-token acceptance rate in [0, 1)), ``k`` (K ≥ 0 draft tokens).
"""

from __future__ import annotations

import random


def sample_accepted(rng: random.Random, alpha: float, k: int) -> int:
    """Draw A, the number of accepted draft tokens (0..K), from the truncated geometric law."""
    accepted = 0
    while accepted < k and rng.random() < alpha:
        accepted += 1
    return accepted
