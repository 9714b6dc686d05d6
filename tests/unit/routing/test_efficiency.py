"""MFU/MBU formulas against worked numbers, and engine-step counting from stream timings."""

from __future__ import annotations

import pytest

from routing.efficiency import (
    IntervalUnion,
    ModelShape,
    RequestTokens,
    StepCounter,
    decode_bytes_per_s,
    linear_flops,
    prefill_kv_read_tokens,
    request_cost,
    utilisation,
)

SEVEN_B_FP16 = ModelShape(params=7e9, layers=32, hidden_size=4096, kv_heads=32, head_dim=128,
                          dtype_bytes=2)
LLAMA3_8B = ModelShape(params=8.03e9, layers=32, hidden_size=4096, kv_heads=8, head_dim=128,
                       dtype_bytes=2)
# A toy shape whose numbers are easy by hand: kv = 2 · 2 layers · 1 head · 2 dims · 2 B = 16 B
TOY = ModelShape(params=1e9, layers=2, hidden_size=4, kv_heads=1, head_dim=2, dtype_bytes=2)


def test_kv_bytes_per_token_worked_numbers() -> None:
    assert SEVEN_B_FP16.kv_bytes_per_token == 524_288  # Llama-2-7B: 2·32·32·128·2
    assert LLAMA3_8B.kv_bytes_per_token == 131_072  # GQA, 8 KV heads
    assert TOY.kv_bytes_per_token == 16
    assert ModelShape(1, 30, 576, 3, 64, 4, kv_dtype_bytes=2).kv_bytes_per_token == 23_040


def test_mbu_of_a_7b_fp16_model_at_100_tokens_per_second_on_a_2_tb_per_s_gpu() -> None:
    # one stream: 100 tokens/s = 100 steps/s, each reading 14 GB of weights → 1.4 TB/s = 70 %
    one_stream = decode_bytes_per_s(SEVEN_B_FP16, steps_per_s=100)
    assert one_stream == pytest.approx(1.4e12)
    assert utilisation(one_stream, 2e12) == pytest.approx(0.70)
    # the same 100 tokens/s over two streams is 50 steps/s: 0.7 TB/s = 35 % (the figure)
    two_streams = decode_bytes_per_s(SEVEN_B_FP16, steps_per_s=50)
    assert utilisation(two_streams, 2e12) == pytest.approx(0.35)


def test_kv_reads_add_to_the_weight_reads_per_step() -> None:
    # 1000 tokens of context on a Llama-2-7B: 524 MB of KV on top of 14 GB per step
    with_kv = decode_bytes_per_s(SEVEN_B_FP16, steps_per_s=10, kv_tokens_per_step=1000)
    assert with_kv == pytest.approx(10 * (14e9 + 524_288_000))


def test_mfu_of_7b_decoding_at_100_tokens_per_second_on_an_a100() -> None:
    achieved = linear_flops(7e9, 100)  # 2·N FLOP per token, per second
    assert achieved == pytest.approx(1.4e12)
    assert utilisation(achieved, 312e12) == pytest.approx(0.004487, rel=1e-3)
    assert utilisation(5.0, 0.0) == 0.0


def test_request_cost_by_hand() -> None:
    # P = 10 prompt tokens, C = 4 cached, G = 3 generated
    cost = request_cost(TOY, RequestTokens(prompt=10, cached=4, completion=3))
    # prefill: 6 tokens; pairs = 6·4 + 6·7/2 = 45; attention = 4·L·d·pairs = 4·2·4·45
    assert cost.prefill_flops == pytest.approx(2e9 * 6 + 1440)
    # decode: 2 steps over contexts 10 and 11: pairs (10+1) + (11+1) = 23
    assert cost.decode_flops == pytest.approx(2e9 * 2 + 4 * 2 * 4 * 23)
    assert cost.prefill_kv_read == 16 * 10
    assert cost.decode_kv_read == 16 * 23
    assert (cost.prefill_kv_write, cost.decode_kv_write) == (16 * 6, 16 * 2)
    assert cost.flops == cost.prefill_flops + cost.decode_flops


def test_attention_rivals_the_linear_term_near_twelve_times_d_model() -> None:
    # per decode token at context c: 4·L·d·c vs 2·N → equal at c = N / (2·L·d) ≈ 30.6k for 8B
    c = int(LLAMA3_8B.params / (2 * LLAMA3_8B.layers * LLAMA3_8B.hidden_size))
    cost = request_cost(LLAMA3_8B, RequestTokens(prompt=c, cached=c - 1, completion=2))
    linear = linear_flops(LLAMA3_8B.params, 1)
    assert cost.decode_flops - linear == pytest.approx(linear, rel=1e-3)


def test_chunked_prefill_rereads_the_growing_prefix() -> None:
    # chunks of 4 over 10 uncached tokens end at 4, 8, 10 → 22 KV positions read
    assert prefill_kv_read_tokens(RequestTokens(10, 0, 1), chunk=4) == 22
    # 2 cached, chunks end at 6 and 10 → 16
    assert prefill_kv_read_tokens(RequestTokens(10, 2, 1), chunk=4) == 16
    assert prefill_kv_read_tokens(RequestTokens(10, 2, 1), chunk=None) == 10
    assert prefill_kv_read_tokens(RequestTokens(10, 2, 1), chunk=64) == 10


def test_request_tokens_clamp_unknown_and_impossible_counts() -> None:
    assert RequestTokens.clamped(None, None, None) == RequestTokens(0, 0, 0)
    # an engine always computes at least one prompt token
    assert RequestTokens.clamped(10, 10, 5) == RequestTokens(10, 9, 5)
    assert RequestTokens.clamped(10, -3, 5).cached == 0
    assert RequestTokens(10, 0, 0).decode_steps == 0
    assert RequestTokens(10, 0, 5).decode_steps == 4


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
