"""Parsing ridge's x-ridge-route header."""

from __future__ import annotations

import pytest

from ridge_bench.harness.route import parse_route


def test_the_documented_example() -> None:
    r = parse_route("pool=radix; lever=prefix_cache; reason=f=0.82,match=14/16")
    assert (r.pool, r.lever, r.reason) == ("radix", "prefix_cache", "f=0.82,match=14/16")


def test_ridge_decision_with_a_detail_field_and_a_decode_pool() -> None:
    r = parse_route("pool=pd-prefill; decode=pd-decode; lever=pd_disaggregation; "
                    "reason=long_uncached_under_load; uncached=3000,load=5.0")
    assert r.pool == "pd-prefill" and r.reason == "long_uncached_under_load"
    assert r.fields["decode"] == "pd-decode"
    assert r.fields["uncached"] == "3000,load=5.0"


@pytest.mark.parametrize("header", [None, "", " ; ", "garbage", "pool="])
def test_missing_or_empty_headers_give_nothing(header: str | None) -> None:
    r = parse_route(header)
    assert (r.pool, r.lever, r.reason) == (None, None, None)


def test_blanks_are_trimmed_and_the_first_repeat_wins() -> None:
    r = parse_route("  pool = general ;reason=least_load; pool=other")
    assert r.pool == "general" and r.reason == "least_load" and r.lever is None
