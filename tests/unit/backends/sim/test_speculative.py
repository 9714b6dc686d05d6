"""The simulator's draws of accepted drafts follow the fleet arithmetic's acceptance law."""

from __future__ import annotations

import random

import pytest

from backends.sim.speculative import position_rates, sample_accepted
from routing.formulas import accepted_pmf, expected_tokens_per_pass


def test_sampled_mean_matches_the_formula() -> None:
    # (1 − 0.8^5) / (1 − 0.8) = 3.3616 tokens per verify pass
    rng = random.Random(7)
    draws = [sample_accepted(rng, (0.8,), 4) + 1 for _ in range(40_000)]
    assert sum(draws) / len(draws) == pytest.approx(expected_tokens_per_pass(0.8, 4), abs=0.03)
    assert max(draws) == 5 and min(draws) == 1


def test_sampled_frequencies_follow_the_truncated_geometric_law() -> None:
    rng = random.Random(11)
    counts = [0] * 5
    for _ in range(40_000):
        counts[sample_accepted(rng, (0.7,), 4)] += 1
    for seen, p in zip(counts, accepted_pmf(0.7, 4), strict=True):
        assert seen / 40_000 == pytest.approx(p, abs=0.01)


def test_edge_rates() -> None:
    assert sample_accepted(random.Random(0), (0.0,), 4) == 0
    assert sample_accepted(random.Random(0), (0.999999,), 0) == 0


def test_position_rates_worked_numbers() -> None:
    # P(A ≥ i) = α_1 · … · α_i: 0.9, 0.9 · 0.6 = 0.54, 0.54 · 0.5 = 0.27; the curve's last
    # value repeats: 0.27 · 0.5 = 0.135
    assert position_rates((0.9, 0.6, 0.5), 4) == pytest.approx([0.9, 0.54, 0.27, 0.135])
    # a constant α is the geometric law: α^i
    assert position_rates((0.7,), 3) == pytest.approx([0.7, 0.49, 0.343])
    assert position_rates((), 2) == [0.0, 0.0]


def test_sampled_positions_follow_a_curve() -> None:
    rng, curve = random.Random(3), (0.9, 0.6, 0.5, 0.3)
    reached = [0] * 4
    for _ in range(40_000):
        for i in range(sample_accepted(rng, curve, 4)):
            reached[i] += 1
    assert [r / 40_000 for r in reached] == pytest.approx(position_rates(curve, 4), abs=0.01)
