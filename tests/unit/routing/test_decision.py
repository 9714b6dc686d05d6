from __future__ import annotations

import re

from routing.decision import (
    FALLBACKS,
    NO_LEVER,
    REASONS,
    RouteDecision,
    fallback_reason,
    lever_values,
    reason_values,
)
from routing.snapshots import LEVERS, PREFIX_CACHE


def test_header_value() -> None:
    d = RouteDecision("radix", None, PREFIX_CACHE, "high_prefix_share", "f=0.82,match=14/16")
    assert d.header_value() == (
        "pool=radix; lever=prefix_cache; reason=high_prefix_share; f=0.82,match=14/16")


def test_header_value_with_a_pair_and_no_detail() -> None:
    d = RouteDecision("prefill", "decode", "pd_disaggregation", "long_uncached_under_load")
    assert d.header_value() == (
        "pool=prefill; decode=decode; lever=pd_disaggregation; reason=long_uncached_under_load")


def test_label_values_are_bounded_and_label_safe() -> None:
    values = reason_values(["pd", "prefix", "spec", "default"])
    assert len(values) == len(REASONS) + 4 * len(FALLBACKS)
    assert fallback_reason("prefix", "fallback_saturated") in values
    assert all(re.fullmatch(r"[a-z_>]+", v) for v in values)
    assert lever_values() == LEVERS | {NO_LEVER}


def test_the_spare_room_reason_is_a_plain_reason() -> None:
    assert "idle_spec_capacity" in REASONS
    assert "idle_spec_capacity" in reason_values(["pd", "spec", "idle_spec", "prefix", "default"])
