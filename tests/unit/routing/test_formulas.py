"""The fleet arithmetic against worked numbers: roofline, FLOPs and bytes, request cost,
speculation, MFU/MBU, goodput."""

from __future__ import annotations

import pytest

from routing.formulas import (
    Bounds,
    HardwareRates,
    Measured,
    ModelShape,
    RequestTokens,
    SeqWork,
    accepted_pmf,
    attention_flops,
    causal_pairs,
    decode_bytes_per_s,
    decode_ridge_tokens,
    evaluate,
    expected_tokens_per_pass,
    goodput_rate,
    host_reload_ratio,
    linear_flops,
    mbu,
    mfu,
    net_speedup,
    prefill_kv_read_tokens,
    request_cost,
    ridge_point,
    spec_batch_limit,
    step_cost,
    utilisation,
)

SEVEN_B_FP16 = ModelShape(params=7e9, layers=32, hidden_size=4096, kv_heads=32, head_dim=128,
                          dtype_bytes=2)
LLAMA2_7B = ModelShape(params=6.74e9, layers=32, hidden_size=4096, kv_heads=32, head_dim=128,
                       dtype_bytes=2)
LLAMA3_8B = ModelShape(params=8.03e9, layers=32, hidden_size=4096, kv_heads=8, head_dim=128,
                       dtype_bytes=2)
LLAMA3_70B = ModelShape(params=70.6e9, layers=80, hidden_size=8192, kv_heads=8, head_dim=128,
                        dtype_bytes=2)
SMOLLM2_FP32 = ModelShape(params=134.5e6, layers=30, hidden_size=576, kv_heads=3, head_dim=64,
                          dtype_bytes=4, kv_dtype_bytes=2)
# A toy shape whose numbers are easy by hand: kv = 2 · 2 layers · 1 head · 2 dims · 2 B = 16 B
TOY = ModelShape(params=1e9, layers=2, hidden_size=4, kv_heads=1, head_dim=2, dtype_bytes=2)

H100 = HardwareRates(peak_flops=989e12, mem_bandwidth=3.35e12)
A100 = HardwareRates(peak_flops=312e12, mem_bandwidth=2.039e12)
GPU_2TBS = HardwareRates(peak_flops=312e12, mem_bandwidth=2e12)
CPU = HardwareRates(peak_flops=1.85e11, mem_bandwidth=32.5e9)


# -- the roofline's ridge ---------------------------------------------------------------------


def test_host_reload_ratio_worked_numbers() -> None:
    # Llama-3-8B fp16: 131,072 B/token over 25 GB/s against 2 · 8.03e9 FLOP at 989e12 FLOP/s
    assert host_reload_ratio(131_072, 25e9, 8.03e9, 989e12) == pytest.approx(0.3228, rel=1e-3)
    # A100 (312e12 FLOP/s): recomputing is slower, reloading is the same: 0.102
    assert host_reload_ratio(131_072, 25e9, 8.03e9, 312e12) == pytest.approx(0.1018, rel=1e-3)
    assert host_reload_ratio(131_072, 1e6, 8.03e9, 989e12) == 1.0  # never dearer than recompute


def test_h100_ridge_point() -> None:
    # 989 TFLOP/s dense bf16 over 3.35 TB/s: ≈295 FLOP/byte
    assert ridge_point(989e12, 3.35e12) == pytest.approx(295.2, rel=1e-3)
    assert H100.ridge_point == ridge_point(989e12, 3.35e12)


def test_decode_turns_compute_bound_near_three_hundred_tokens_on_an_h100() -> None:
    assert decode_ridge_tokens(989e12, 3.35e12, 2) == pytest.approx(295.2, rel=1e-3)


def test_a100_int8_weights() -> None:
    # A100 80GB: 312 TFLOP/s bf16, 2.039 TB/s; 1-byte weights halve the crossover batch
    assert decode_ridge_tokens(312e12, 2.039e12, 1) == pytest.approx(76.5, rel=1e-2)


# -- bytes and FLOPs per token ----------------------------------------------------------------


def test_kv_bytes_per_token_worked_numbers() -> None:
    assert LLAMA2_7B.kv_bytes_per_token == 2 * 32 * 32 * 128 * 2 == 524_288
    assert LLAMA3_8B.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072  # GQA, 8 KV heads
    assert TOY.kv_bytes_per_token == 16
    # SmolLM2 in float32 with a 16-bit KV cache, as vLLM's CPU backend keeps it
    assert SMOLLM2_FP32.kv_bytes_per_token == 23_040


def test_weights_are_n_times_dtype_bytes() -> None:
    assert SEVEN_B_FP16.weight_bytes == 14e9
    assert SMOLLM2_FP32.weight_bytes == 134.5e6 * 4  # the KV dtype does not change the weights


def test_attention_term_is_4_layers_hidden_per_pair() -> None:
    # one token at context c attends to c + 1 positions
    assert causal_pairs(1, 100) == 101
    assert attention_flops(LLAMA3_8B, causal_pairs(1, 100)) == 4 * 32 * 4096 * 101
    # q new tokens over nothing: q(q + 1)/2 causal pairs
    assert causal_pairs(4, 0) == 10
    assert linear_flops(7e9, 3) == 4.2e10


# -- one engine step --------------------------------------------------------------------------


def _decode_seconds(shape: ModelShape, rates: HardwareRates) -> float:
    return step_cost(shape, rates, [SeqWork(1, 1)]).seconds


def test_7b_fp16_on_2tbs_decodes_a_step_in_about_7ms() -> None:
    # 7e9 params · 2 B = 14 GB read per step; 14 GB / 2 TB/s = 7 ms
    assert _decode_seconds(SEVEN_B_FP16, GPU_2TBS) == pytest.approx(7e-3, rel=0.01)


def test_70b_on_h100_fp16_and_int8() -> None:
    int8 = ModelShape(70.6e9, 80, 8192, 8, 128, dtype_bytes=1)
    # 70.6e9 · 2 B / 3.35 TB/s ≈ 42 ms; at one byte per weight ≈ 21 ms
    assert _decode_seconds(LLAMA3_70B, H100) == pytest.approx(42e-3, rel=0.02)
    assert _decode_seconds(int8, H100) == pytest.approx(21e-3, rel=0.02)


def test_batching_32_decodes_costs_about_1_2_times_one() -> None:
    # Llama-2-7B on an A100 at 192 tokens of context: one decode reads 13.5 GB of weights; 32 of
    # them read the same weights once plus 32 · 193 · 0.52 MB = 3.2 GB of KV -> ≈ 1.23x the time
    # for 32x the tokens, still memory-bound.
    one = step_cost(LLAMA2_7B, A100, [SeqWork(1, 192)])
    many = step_cost(LLAMA2_7B, A100, [SeqWork(1, 192)] * 32)
    assert many.bound == "memory"
    assert 1.15 <= many.seconds / one.seconds <= 1.3


def test_long_prefill_is_compute_bound_and_decode_memory_bound() -> None:
    prefill = step_cost(LLAMA3_8B, A100, [SeqWork(2048, 0)])
    decode = step_cost(LLAMA3_8B, A100, [SeqWork(1, 2048)])
    assert prefill.bound == "compute"
    assert decode.bound == "memory"
    # prefill ≈ (2N · 2048 + attention) / 312 TFLOP/s
    expected = (2 * 8.03e9 * 2048 + attention_flops(LLAMA3_8B, causal_pairs(2048, 0))) / 312e12
    assert prefill.seconds == pytest.approx(expected, rel=1e-9)
    assert prefill.flops == prefill.linear_flops + prefill.attention_flops


def test_step_bytes_are_weights_once_plus_each_sequences_kv() -> None:
    # TOY: weights 2 GB; kv 16 B/token; two sequences (q, c) = (3, 5) and (1, 9)
    cost = step_cost(TOY, GPU_2TBS, [SeqWork(3, 5), SeqWork(1, 9)])
    assert cost.read_bytes == 2e9 + 16 * (8 + 10)
    assert cost.write_bytes == 16 * 4
    assert cost.linear_flops == 2e9 * 4
    assert cost.attention_flops == 4 * 2 * 4 * (causal_pairs(3, 5) + causal_pairs(1, 9))


def test_overheads_add_per_step_and_per_sequence() -> None:
    work = [SeqWork(1, 10)] * 4
    bare = step_cost(SEVEN_B_FP16, GPU_2TBS, work)
    dressed = step_cost(SEVEN_B_FP16, GPU_2TBS, work, step_overhead_s=0.002, seq_overhead_s=0.001)
    assert dressed.seconds - bare.seconds == pytest.approx(0.006)


def test_attention_efficiency_slows_only_the_attention_term() -> None:
    work = [SeqWork(512, 512)]
    fast = step_cost(SMOLLM2_FP32, CPU, work)
    slow = step_cost(SMOLLM2_FP32, CPU, work, attention_efficiency=0.5)
    extra = attention_flops(SMOLLM2_FP32, causal_pairs(512, 512)) / CPU.peak_flops  # 2x the term
    assert slow.compute_s - fast.compute_s == pytest.approx(extra)
    assert slow.memory_s == fast.memory_s


def test_prefill_with_cached_prefix_skips_the_cached_part() -> None:
    full = step_cost(LLAMA3_8B, A100, [SeqWork(4096, 0)]).seconds
    warm = step_cost(LLAMA3_8B, A100, [SeqWork(4096 - 3072, 3072)]).seconds
    assert warm / full == pytest.approx(0.25, abs=0.03)


def test_empty_step_costs_nothing() -> None:
    assert step_cost(SEVEN_B_FP16, GPU_2TBS, []).seconds == 0.0


# -- one request's cost -----------------------------------------------------------------------


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


def test_a_request_costs_what_its_engine_steps_cost() -> None:
    # the same request as one prefill step and G − 1 decode steps of the roofline
    tokens = RequestTokens(prompt=10, cached=4, completion=3)
    cost = request_cost(TOY, tokens)
    steps = [[SeqWork(6, 4)], [SeqWork(1, 10)], [SeqWork(1, 11)]]
    flops = sum(step_cost(TOY, GPU_2TBS, s).flops for s in steps)
    assert cost.flops == pytest.approx(flops)


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
    assert request_cost(TOY, RequestTokens(10, 0, 1), chunk=4).prefill_kv_read == 16 * 22


def test_request_tokens_clamp_unknown_and_impossible_counts() -> None:
    assert RequestTokens.clamped(None, None, None) == RequestTokens(0, 0, 0)
    # an engine always computes at least one prompt token
    assert RequestTokens.clamped(10, 10, 5) == RequestTokens(10, 9, 5)
    assert RequestTokens.clamped(10, -3, 5).cached == 0
    assert RequestTokens(10, 0, 0).decode_steps == 0
    assert RequestTokens(10, 0, 5).decode_steps == 4


# -- speculative decoding ---------------------------------------------------------------------


def test_alpha_07_k4_yields_2_77_tokens_per_target_pass() -> None:
    # (1 − 0.7^5) / (1 − 0.7) = (1 − 0.16807) / 0.3 = 2.7731
    assert expected_tokens_per_pass(0.7, 4) == pytest.approx(2.7731, abs=1e-4)


def test_alpha_08_k4_yields_3_36_tokens_per_target_pass() -> None:
    # (1 − 0.8^5) / (1 − 0.8) = (1 − 0.32768) / 0.2 = 3.3616
    assert expected_tokens_per_pass(0.8, 4) == pytest.approx(3.3616)


def test_pmf_is_the_truncated_geometric_law() -> None:
    pmf = accepted_pmf(0.8, 4)
    assert sum(pmf) == pytest.approx(1.0)
    assert pmf[0] == pytest.approx(0.2)
    assert pmf[4] == pytest.approx(0.8**4)
    assert sum((a + 1) * p for a, p in enumerate(pmf)) == pytest.approx(3.3616)


def test_edge_acceptance_rates() -> None:
    assert expected_tokens_per_pass(0.0, 4) == 1.0
    assert expected_tokens_per_pass(1.0, 4) == 5.0
    assert accepted_pmf(0.5, 0) == [1.0]


def test_net_speedup_pays_for_drafting() -> None:
    # E / (1 + c·K) = 3.3616 / 1.2
    assert net_speedup(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2)
    assert net_speedup(0.7, 4, 0.0) == expected_tokens_per_pass(0.7, 4)


def test_speculation_batch_limit_on_an_l4() -> None:
    # L4: 121e12 / 300e9 ≈ 403 tokens (2-byte weights); K = 4: 0.5 · 403 / 5 ≈ 40 sequences
    ridge = decode_ridge_tokens(121e12, 300e9, 2)
    assert spec_batch_limit(ridge, 4, 0.5) == pytest.approx(40.33, abs=0.01)
    assert spec_batch_limit(ridge, 0, 1.0) == ridge  # no drafts: one token per sequence
    assert spec_batch_limit(ridge, -1, 1.0) == ridge
    assert spec_batch_limit(0.0, 4, 0.5) == 0.0  # an unknown ridge admits nothing


# -- utilisation ------------------------------------------------------------------------------


def test_mbu_of_a_7b_fp16_model_at_100_tokens_per_second_on_a_2_tb_per_s_gpu() -> None:
    # one stream: 100 tokens/s = 100 steps/s, each reading 14 GB of weights → 1.4 TB/s = 70 %
    one_stream = decode_bytes_per_s(SEVEN_B_FP16, steps_per_s=100)
    assert one_stream == pytest.approx(1.4e12)
    assert mbu(one_stream, GPU_2TBS) == pytest.approx(0.70)
    # the same 100 tokens/s over two streams is 50 steps/s: 0.7 TB/s = 35 %
    two_streams = decode_bytes_per_s(SEVEN_B_FP16, steps_per_s=50)
    assert utilisation(two_streams, 2e12) == pytest.approx(0.35)


def test_kv_reads_add_to_the_weight_reads_per_step() -> None:
    # 1000 tokens of context on a Llama-2-7B-shaped 7B: 524 MB of KV on top of 14 GB per step
    with_kv = decode_bytes_per_s(SEVEN_B_FP16, steps_per_s=10, kv_tokens_per_step=1000)
    assert with_kv == pytest.approx(10 * (14e9 + 524_288_000))


def test_mfu_of_7b_decoding_at_100_tokens_per_second_on_an_a100() -> None:
    achieved = linear_flops(7e9, 100)  # 2·N FLOP per token, per second
    assert achieved == pytest.approx(1.4e12)
    assert mfu(achieved, A100) == pytest.approx(0.004487, rel=1e-3)
    assert utilisation(5.0, 0.0) == 0.0


# -- goodput ----------------------------------------------------------------------------------

TIGHT = Bounds(ttft_s=0.5, tpot_s=0.05, e2e_s=10.0)


@pytest.mark.parametrize(
    ("measured", "violated"),
    [
        (Measured(200, e2e_s=2.0, ttft_s=0.2, tpot_s=0.02), ()),
        (Measured(200, e2e_s=10.0, ttft_s=0.5, tpot_s=0.05), ()),  # a bound is met at equality
        (Measured(200, e2e_s=2.0, ttft_s=0.6, tpot_s=0.02), ("ttft",)),
        (Measured(200, e2e_s=2.0, ttft_s=0.2, tpot_s=0.06), ("tpot",)),
        (Measured(200, e2e_s=12.0, ttft_s=0.9, tpot_s=0.2), ("ttft", "tpot", "e2e")),
        (Measured(200, e2e_s=12.0), ("e2e",)),  # non-streamed: no TTFT/TPOT to hold against
        (Measured(502, e2e_s=0.1), ("error",)),
        (Measured(504, e2e_s=300.0, ttft_s=None), ("error",)),
    ],
)
def test_violated_bounds_are_named(measured: Measured, violated: tuple[str, ...]) -> None:
    verdict = evaluate(TIGHT, measured)
    assert verdict.evaluated
    assert verdict.violated == violated
    assert verdict.good is (not violated)


@pytest.mark.parametrize("status", [400, 404, 413, 499])
def test_client_errors_are_not_held_against_the_slo(status: int) -> None:
    verdict = evaluate(TIGHT, Measured(status, e2e_s=100.0))
    assert not verdict.evaluated and not verdict.good


def test_no_bound_means_nothing_to_violate() -> None:
    assert evaluate(Bounds(), Measured(200, e2e_s=1e9, ttft_s=1e9, tpot_s=1e9)).good
    assert evaluate(Bounds(e2e_s=1.0), Measured(200, e2e_s=0.5, ttft_s=99.0)).good


def test_bounds_by_name_and_inheritance() -> None:
    assert Bounds(ttft_s=1.0, e2e_s=2.0).by_name() == {"ttft": 1.0, "e2e": 2.0}
    assert Bounds(e2e_s=60.0).over(TIGHT) == Bounds(0.5, 0.05, 60.0)


def test_goodput_is_good_requests_per_second_of_window() -> None:
    # 45 of 60 requests met every bound in a 30 s window: 1.5 good requests/s
    assert goodput_rate(45, 30.0) == 1.5
    assert goodput_rate(3, 0.0) == 0.0
