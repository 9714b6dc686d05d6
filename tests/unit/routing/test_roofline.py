from __future__ import annotations

import pytest

from routing.roofline import decode_ridge_tokens, ridge_point


def test_h100_ridge_point() -> None:
    # 989 TFLOP/s dense bf16 over 3.35 TB/s: ≈295 FLOP/byte
    assert ridge_point(989e12, 3.35e12) == pytest.approx(295.2, rel=1e-3)


def test_decode_turns_compute_bound_near_three_hundred_tokens_on_an_h100() -> None:
    assert decode_ridge_tokens(989e12, 3.35e12, 2) == pytest.approx(295.2, rel=1e-3)


def test_a100_int8_weights() -> None:
    # A100 80GB: 312 TFLOP/s bf16, 2.039 TB/s; 1-byte weights halve the crossover batch
    assert decode_ridge_tokens(312e12, 2.039e12, 1) == pytest.approx(76.5, rel=1e-2)
