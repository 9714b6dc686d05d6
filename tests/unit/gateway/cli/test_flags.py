"""gateway.cli.flags: the argparse types the commands share."""

from __future__ import annotations

import argparse

import pytest

from gateway.cli.flags import count, positive


def test_positive_is_a_finite_number_above_zero() -> None:
    assert positive("2.5") == 2.5
    for bad in ("0", "-1", "inf", "nan", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive(bad)


def test_count_is_a_whole_number_of_one_or_more() -> None:
    assert count("3") == 3
    for bad in ("0", "1.5", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            count(bad)
