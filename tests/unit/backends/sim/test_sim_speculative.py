"""Speculative decoding's acceptance law against worked numbers."""

from __future__ import annotations

import random

import pytest

from backends.sim.speculative import (
    accepted_pmf,
    expected_tokens_per_step,
    net_speedup,
    sample_accepted,
)


def test_alpha_08_k4_yields_3_36_tokens_per_verify_step() -> None:
    # (1 − 0.8^5) / (1 − 0.8) = (1 − 0.32768) / 0.2 = 3.3616
    assert expected_tokens_per_step(0.8, 4) == pytest.approx(3.3616)


def test_sampled_mean_matches_the_formula() -> None:
    rng = random.Random(7)
    draws = [sample_accepted(rng, 0.8, 4) + 1 for _ in range(40_000)]
    assert sum(draws) / len(draws) == pytest.approx(3.3616, abs=0.03)
    assert max(draws) == 5 and min(draws) == 1


def test_pmf_is_the_truncated_geometric_law() -> None:
    pmf = accepted_pmf(0.8, 4)
    assert sum(pmf) == pytest.approx(1.0)
    assert pmf[0] == pytest.approx(0.2)
    assert pmf[4] == pytest.approx(0.8**4)
    assert sum((a + 1) * p for a, p in enumerate(pmf)) == pytest.approx(3.3616)


def test_edge_rates() -> None:
    assert expected_tokens_per_step(0.0, 4) == 1.0
    assert expected_tokens_per_step(1.0, 4) == 5.0
    assert sample_accepted(random.Random(0), 0.0, 4) == 0
    assert sample_accepted(random.Random(0), 0.999999, 0) == 0


def test_net_speedup_pays_for_drafting() -> None:
    # E / (1 + c·K) = 3.3616 / 1.2
    assert net_speedup(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2)
