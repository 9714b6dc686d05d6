"""The simulated device: the pool's facts and a hardware profile's calibration, priced with the
fleet arithmetic's roofline (its formulas are tested in tests/unit/routing/test_formulas.py)."""

from __future__ import annotations

import pytest

from backends.sim.configure import device_for
from backends.sim.device import Device, Overheads
from backends.sim.profiles import HARDWARE, MODELS
from routing.formulas import SeqWork, attention_flops, causal_pairs, step_cost
from tests.unit.backends.sim.sim_helpers import make_pool

LLAMA3_8B = MODELS["llama-3-8b"].to_shape()
A100 = HARDWARE["a100-80gb"].facts.to_rates()


def test_a_bare_device_steps_at_the_roofline() -> None:
    # Llama-3-8B on an A100: 16 GB of weights / 2.039 TB/s ≈ 7.9 ms per decode step
    dev = Device(LLAMA3_8B, A100)
    work = [SeqWork(1, 1)]
    assert dev.step_cost(work) == step_cost(LLAMA3_8B, A100, work)
    assert dev.step_cost(work).seconds == pytest.approx(16.06e9 / 2.039e12, rel=1e-3)


def test_overheads_add_per_step_and_per_sequence() -> None:
    bare = Device(LLAMA3_8B, A100)
    dressed = Device(LLAMA3_8B, A100, overheads=Overheads(request_s=1.0, step_s=0.002, seq_s=0.001))
    work = [SeqWork(1, 10)] * 4
    # 2 ms per step + 4 · 1 ms per sequence; the request overhead is not the step's
    assert dressed.step_cost(work).seconds - bare.step_cost(work).seconds == pytest.approx(0.006)


def test_attention_efficiency_slows_only_the_attention_term() -> None:
    shape = MODELS["smollm2-135m"].to_shape(kv_dtype_bytes=2)
    rates = HARDWARE["cpu-smollm2"].facts.to_rates()
    fast = Device(shape, rates).step_cost([SeqWork(512, 512)])
    slow = Device(shape, rates, attention_efficiency=0.5).step_cost([SeqWork(512, 512)])
    extra = attention_flops(shape, causal_pairs(512, 512)) / rates.peak_flops  # 2x the term
    assert slow.compute_s - fast.compute_s == pytest.approx(extra)


def test_a_pool_becomes_its_profiles_device() -> None:
    # the CPU profile keeps a 16-bit KV cache for a float32 model: 2·30·3·64·2 = 23,040 B/token
    dev = device_for(make_pool(model="smollm2-135m", hardware="cpu-smollm2"))
    assert dev.shape.kv_bytes_per_token == 23_040
    assert dev.shape.weight_bytes == 134.5e6 * 4
    assert dev.rates == HARDWARE["cpu-smollm2"].facts.to_rates()
    assert dev.overheads == HARDWARE["cpu-smollm2"].overheads
