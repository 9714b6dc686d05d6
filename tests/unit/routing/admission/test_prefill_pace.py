"""Prefill pacing's arithmetic, against worked numbers."""

from __future__ import annotations

import pytest

from routing.admission.prefill_pace import (
    NOTHING,
    PeerPrefill,
    PrefillRate,
    paced_endpoints,
    prefill_cap,
    prefill_wait_s,
    roofline_prefill_rate,
)
from routing.formulas import HardwareRates, ModelShape


def test_the_rate_is_the_outstanding_prefill_over_the_engine_ttft_weighted() -> None:
    rate = PrefillRate(weight=0.1)
    assert rate.tokens_per_s is None
    rate.observe(4_800, 0.6)  # the first observation stands alone: 8,000 tokens/s
    assert rate.tokens_per_s == pytest.approx(8_000)
    rate.observe(2_000, 0.5)  # 4,000 tokens/s, weight 0.1: 8,000 + 0.1 × (4,000 − 8,000)
    assert rate.tokens_per_s == pytest.approx(7_600)
    rate.observe(0, 0.5)
    rate.observe(1_000, 0.0)  # nothing to learn from either
    assert rate.tokens_per_s == pytest.approx(7_600)


def test_the_cap_is_what_the_rate_clears_within_the_target_share_of_the_slo() -> None:
    assert prefill_cap(8_000, 1.0, 0.5) == pytest.approx(4_000)
    assert prefill_cap(8_000, 0.25, 1.0) == pytest.approx(2_000)


def test_an_endpoint_is_paced_when_its_outstanding_prefill_and_the_prompt_pass_the_cap() -> None:
    caps = {"a": 4_000.0, "b": 4_000.0, "c": None}
    outstanding = {"a": 2_400, "b": 1_000, "c": 90_000}
    assert paced_endpoints(outstanding, 2_400, caps.get) == frozenset({"a"})  # 4,800 > 4,000
    assert paced_endpoints(outstanding, 1_600, caps.get) is NOTHING  # 4,000 is not over it
    assert paced_endpoints({}, 10**9, caps.get) is NOTHING  # nothing outstanding: never paced


def test_the_prefill_wait_is_the_excess_over_the_pools_caps_at_the_pools_rate() -> None:
    # 4,800 outstanding + 2,400 own − 2 × 3,000 = 1,200 tokens at 2 × 6,000 tokens/s
    assert prefill_wait_s(4_800, 2_400, 0, 2, 3_000, 6_000) == pytest.approx(0.1)
    # two requests of its size ahead: + 4,800 tokens → 6,000 ÷ 12,000
    assert prefill_wait_s(4_800, 2_400, 2, 2, 3_000, 6_000) == pytest.approx(0.5)
    assert prefill_wait_s(0, 2_400, 0, 2, 3_000, 6_000) == 0.0  # fits now


def test_the_prior_is_a_chunks_roofline_step_times_the_efficiency() -> None:
    """Llama-3-8B fp16 on an L4, chunks of 512: compute (8.22e12 linear + 6.9e10 attention
    FLOP ÷ 121e12 FLOP/s = 68.5 ms) binds over memory (16.2 GB ÷ 300 GB/s = 54 ms): 512 ÷
    0.0685 ≈ 7,470 tokens/s, half of it 3,735."""
    llama, l4 = ModelShape(8.03e9, 32, 4096, 8, 128, 2), HardwareRates(121e12, 300e9)
    assert roofline_prefill_rate(llama, l4, 512, 0.5) == pytest.approx(3735, rel=0.005)
    assert roofline_prefill_rate(llama, l4, 512, 1.0) == pytest.approx(7470, rel=0.005)
    # a chunk of 64 is memory-bound: the weights' read, not the FLOPs, sets the step
    assert roofline_prefill_rate(llama, l4, 64, 1.0) < 64 / 0.053


def test_peers_arrivals_count_as_prefill_until_they_would_have_been_prefilled() -> None:
    """Two requests of other gateways appear on A (prompts of 2,000 tokens taken, 1,000
    tokens/s): 4,000 tokens outstanding for 4 s; one more a second later adds 2,000 and moves
    the end to 1 + 6 = 7 s; a falling count changes nothing; after the end, nothing."""
    peers = PeerPrefill()
    peers.observe("A", 0, 2000, 1000.0, now=0.0)
    assert peers.urls == () and peers.outstanding("A", 0.0) == 0
    peers.observe("A", 2, 2000, 1000.0, now=0.0)
    assert peers.outstanding("A", 3.9) == 4000 and peers.outstanding("A", 4.0) == 0
    peers.observe("A", 3, 2000, 1000.0, now=1.0)
    assert peers.outstanding("A", 6.9) == 6000
    peers.observe("A", 1, 2000, 1000.0, now=2.0)
    assert peers.outstanding("A", 6.9) == 6000 and peers.outstanding("A", 7.0) == 0
    peers.observe("A", 2, 2000, 1000.0, now=8.0)  # a rise after the end starts afresh
    assert peers.outstanding("A", 9.0) == 2000
    peers.observe("A", 3, 2000, None, now=9.0)  # no rate: nothing known to add
    assert peers.outstanding("A", 9.0) == 2000
