"""Engine-step counting from stream timings: the interval union and the per-endpoint counter."""

from __future__ import annotations

import random

import pytest

from gateway.telemetry.engine_steps import IntervalUnion, StepCounter
from routing.formulas import RequestTokens


def test_interval_union_reports_only_new_time() -> None:
    union = IntervalUnion()
    assert union.add(0.0, 10.0) == [(0.0, 10.0)]
    assert union.add(5.0, 15.0) == [(10.0, 15.0)]
    assert union.add(20.0, 30.0) == [(20.0, 30.0)]
    assert union.add(-5.0, 25.0) == [(-5.0, 0.0), (15.0, 20.0)]
    assert union.add(1.0, 2.0) == []
    assert len(union) == 1
    assert union.covers(-5.0) and union.covers(30.0) and not union.covers(30.5)
    assert union.covers(30.5, tolerance=1.0)


def test_interval_union_forgets_old_intervals_and_stays_bounded() -> None:
    union = IntervalUnion(max_intervals=3)
    for i in range(10):
        union.add(float(2 * i), float(2 * i + 1))
    assert len(union) == 3
    union.forget_before(17.5)
    assert len(union) == 1


def _gaps(n: int, step: float) -> tuple[float, ...]:
    return (step,) * n


@pytest.mark.parametrize("seed", range(20))
def test_covered_answers_as_covers_does_for_each_instant(seed: int) -> None:
    rng = random.Random(seed)
    union = IntervalUnion()
    for _ in range(rng.randrange(0, 8)):
        start = rng.uniform(0, 10)
        union.add(start, start + rng.uniform(0, 2))
    times = sorted(rng.uniform(-1, 12) for _ in range(30))
    if seed % 4 == 0:  # out of order too
        rng.shuffle(times)
    for tolerance in (0.0, 0.05):
        assert union.covered(times, tolerance) == [union.covers(t, tolerance) for t in times]


def test_covered_walks_over_several_intervals_and_their_gaps() -> None:
    union = IntervalUnion()
    union.add(1.0, 2.0)
    union.add(3.0, 4.0)
    times = [0.5, 1.0, 1.5, 2.0, 2.5, 2.999, 3.0, 4.0, 4.001, 9.0]
    assert union.covered(times) == [False, True, True, True, False, False, True, True, False,
                                     False]
    assert union.covered(times, 0.002) == [False, True, True, True, False, True, True, True,
                                           True, False]
    assert IntervalUnion().covered(times) == [False] * len(times)


def test_streams_in_one_batch_share_their_steps() -> None:
    counter = StepCounter(prefill_shares_decode_steps=True, tolerance_s=0.001)
    tokens = RequestTokens(100, 0, 11)  # 10 decode steps
    first = counter.add(1.0, 2.0, tokens, _gaps(10, 0.1))
    second = counter.add(1.0, 2.0, tokens, _gaps(10, 0.1))  # same batch, same steps
    assert (first.prefill, first.decode_total) == (1.0, 10.0)
    assert (second.prefill, second.decode) == (0.0, ())  # batched prefill, shared decodes


def test_streams_apart_in_time_each_bring_their_steps() -> None:
    counter = StepCounter(prefill_shares_decode_steps=True, tolerance_s=0.001)
    tokens = RequestTokens(100, 0, 11)
    counter.add(1.0, 2.0, tokens, _gaps(10, 0.1))
    later = counter.add(5.0, 6.0, tokens, _gaps(10, 0.1))
    assert (later.prefill, later.decode_total) == (1.0, 10.0)


def test_half_overlapping_stream_counts_its_uncovered_tokens() -> None:
    counter = StepCounter(prefill_shares_decode_steps=True, tolerance_s=0.001)
    counter.add(0.0, 1.0, RequestTokens(10, 0, 11), _gaps(10, 0.1))
    # tokens every 0.1 s from 0.55: at 0.65 … 1.45; those after 1.0 + tolerance are new
    steps = counter.add(0.55, 1.45, RequestTokens(10, 0, 10), _gaps(9, 0.1))
    # the new steps, where they happened: 1.05, 1.15, 1.25, 1.35, 1.45
    (span,) = steps.decode
    assert (span.start, span.end, span.steps) == pytest.approx((1.05, 1.45, 5.0))
    assert steps.prefill == 0.0  # vLLM: its prefill rode in a running decode step


def test_prefill_only_engines_run_a_step_per_prefill_batch() -> None:
    counter = StepCounter(prefill_shares_decode_steps=False, tolerance_s=0.001)
    counter.add(0.0, 1.0, RequestTokens(10, 0, 11), _gaps(10, 0.1))
    steps = counter.add(0.55, 1.45, RequestTokens(10, 0, 10), _gaps(9, 0.1))
    assert steps.prefill == 1.0  # SGLang: prefill-first, a step of its own


def test_without_token_times_steps_are_spread_evenly() -> None:
    counter = StepCounter(prefill_shares_decode_steps=True)
    counter.add(0.0, 1.0, RequestTokens(10, 0, 11))
    steps = counter.add(0.5, 1.5, RequestTokens(10, 0, 11))  # half its interval is new
    (span,) = steps.decode
    assert (span.start, span.end, span.steps) == pytest.approx((1.0, 1.5, 5.0))
    assert counter.add(3.0, 3.0, RequestTokens(10, 0, 4)).decode_total == 3.0  # no duration
    assert counter.add(4.0, 5.0, RequestTokens(10, 0, 1)).decode == ()  # one token, no decode


def test_first_token_instants_stay_bounded_and_recent_ones_still_batch() -> None:
    # prefill-only, so that only the first-token instants decide a prefill's step
    counter = StepCounter(prefill_shares_decode_steps=False, tolerance_s=0.001,
                          horizon_s=1e9, max_intervals=8)
    one_token = RequestTokens(10, 0, 1)
    for i in range(1000):
        at = float(i)
        assert counter.add(at, at, one_token).prefill == 1.0  # a second apart: a step each
        assert counter.add(at, at, one_token).prefill == 0.0  # the same instant: batched
        assert len(counter._firsts) <= 8 + 8 // 4  # cut in batches, never past a quarter more


def test_first_token_instants_past_the_horizon_are_forgotten() -> None:
    counter = StepCounter(prefill_shares_decode_steps=False, tolerance_s=0.001, horizon_s=10.0)
    one_token = RequestTokens(10, 0, 1)
    for i in range(100):
        counter.add(float(i), float(i), one_token)
    assert len(counter._firsts) <= 2 * 11  # what is past the horizon: at most half the list
    counter.add(1e6, 1e6, one_token)  # long after: every earlier instant is past the horizon
    assert counter._firsts == [1e6]
