"""The roofline formulas against worked numbers."""

from __future__ import annotations

import pytest

from backends.config import HardwareFacts, ModelFacts
from backends.sim.profiles import HARDWARE, MODELS
from backends.sim.roofline import (
    Device,
    Overheads,
    SeqWork,
    attention_flops,
    decode_step_seconds,
    kv_bytes_per_token,
    prefill_seconds,
    ridge_point,
    step_cost,
    weight_bytes,
)

SEVEN_B = ModelFacts(
    params=7e9, layers=32, hidden_size=4096, kv_heads=32, head_dim=128, dtype_bytes=2
)
GPU_2TBS = HardwareFacts(peak_flops=312e12, mem_bandwidth=2e12)


def device(model: ModelFacts, hw: HardwareFacts, **kw: float) -> Device:
    return Device(model=model, hardware=hw, kv_dtype_bytes=model.dtype_bytes, **kw)  # type: ignore[arg-type]


def test_kv_bytes_per_token_worked_examples() -> None:
    # 2 · layers · kv_heads · head_dim · bytes
    assert kv_bytes_per_token(MODELS["llama-2-7b"]) == 2 * 32 * 32 * 128 * 2 == 524_288
    assert kv_bytes_per_token(MODELS["llama-3-8b"]) == 2 * 32 * 8 * 128 * 2 == 131_072
    assert kv_bytes_per_token(MODELS["smollm2-135m"], kv_dtype_bytes=2) == 23_040


def test_7b_fp16_on_2tbs_decodes_a_step_in_about_7ms() -> None:
    # 7e9 params · 2 B = 14 GB read per step; 14 GB / 2 TB/s = 7 ms
    seconds = decode_step_seconds(device(SEVEN_B, GPU_2TBS), batch=1, context=1)
    assert seconds == pytest.approx(7e-3, rel=0.01)


def test_70b_on_h100_fp16_and_int8() -> None:
    h100 = HARDWARE["h100-sxm"].facts
    fp16 = MODELS["llama-3-70b"]
    int8 = fp16.model_copy(update={"dtype_bytes": 1})
    # 70.6e9 · 2 B / 3.35 TB/s ≈ 42 ms; at one byte per weight ≈ 21 ms
    assert decode_step_seconds(device(fp16, h100), 1, 1) == pytest.approx(42e-3, rel=0.02)
    assert decode_step_seconds(device(int8, h100), 1, 1) == pytest.approx(21e-3, rel=0.02)


def test_batching_32_decodes_costs_about_1_2_times_one() -> None:
    # Llama-2-7B on an A100 at 192 tokens of context: one decode reads 13.5 GB of weights; 32 of
    # them read the same weights once plus 32 · 193 · 0.52 MB = 3.2 GB of KV -> ≈ 1.23x the time
    # for 32x the tokens, still memory-bound.
    dev = device(MODELS["llama-2-7b"], HARDWARE["a100-80gb"].facts)
    one = step_cost(dev, [SeqWork(1, 192)])
    many = step_cost(dev, [SeqWork(1, 192)] * 32)
    assert many.bound == "memory"
    assert 1.15 <= many.seconds / one.seconds <= 1.3


def test_attention_term_is_4_layers_hidden_per_pair() -> None:
    model = MODELS["llama-3-8b"]
    # one token at context c attends to c + 1 positions
    assert attention_flops(model, 1, 100) == 4 * 32 * 4096 * 101
    # q new tokens over nothing: q(q + 1)/2 causal pairs
    assert attention_flops(model, 4, 0) == 4 * 32 * 4096 * 10


def test_long_prefill_is_compute_bound_and_decode_memory_bound() -> None:
    dev = device(MODELS["llama-3-8b"], HARDWARE["a100-80gb"].facts)
    prefill = step_cost(dev, [SeqWork(2048, 0)])
    decode = step_cost(dev, [SeqWork(1, 2048)])
    assert prefill.bound == "compute"
    assert decode.bound == "memory"
    # prefill ≈ (2N · 2048 + attention) / 312 TFLOP/s
    expected = (2 * 8.03e9 * 2048 + attention_flops(dev.model, 2048, 0)) / 312e12
    assert prefill.seconds == pytest.approx(expected, rel=1e-9)
    assert ridge_point(dev.hardware) == pytest.approx(312e12 / 2.039e12)


def test_overheads_add_per_step_and_per_sequence() -> None:
    over = Overheads(step_s=0.002, seq_s=0.001)
    bare = device(SEVEN_B, GPU_2TBS)
    dressed = device(SEVEN_B, GPU_2TBS, overheads=over)  # type: ignore[arg-type]
    work = [SeqWork(1, 10)] * 4
    assert step_cost(dressed, work).seconds - step_cost(bare, work).seconds == pytest.approx(0.006)


def test_attention_efficiency_slows_only_the_attention_term() -> None:
    model = MODELS["smollm2-135m"]
    hw = HARDWARE["cpu-smollm2"].facts
    fast = step_cost(device(model, hw), [SeqWork(512, 512)])
    slow = step_cost(device(model, hw, attention_efficiency=0.5), [SeqWork(512, 512)])
    extra = attention_flops(model, 512, 512) / hw.peak_flops  # twice the time of the term
    assert slow.compute_s - fast.compute_s == pytest.approx(extra)


def test_prefill_with_cached_prefix_skips_the_cached_part() -> None:
    dev = device(MODELS["llama-3-8b"], HARDWARE["a100-80gb"].facts)
    full = prefill_seconds(dev, 4096)
    warm = prefill_seconds(dev, 4096, cached_tokens=3072)
    assert warm / full == pytest.approx(0.25, abs=0.03)


def test_empty_step_costs_nothing_and_weights_are_n_times_dtype() -> None:
    dev = device(SEVEN_B, GPU_2TBS)
    assert step_cost(dev, []).seconds == 0.0
    assert weight_bytes(SEVEN_B) == 14e9
