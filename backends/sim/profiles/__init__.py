"""Named model and hardware profiles the simulator (and its docs and tests) can refer to.

A *model profile* is a :class:`~backends.config.ModelFacts` for a well-known model. A *hardware
profile* is a :class:`~backends.config.HardwareFacts` (peak dense FLOP/s, memory bandwidth B/s)
plus what the roofline cannot know by itself: device memory [B] (for the KV-cache budget), the
device kind ("gpu" or "cpu", which picks the engine's default KV block size), the attention
efficiency and the fixed overheads (see :mod:`backends.sim.roofline`).

GPU figures are the vendors' dense 16-bit tensor peaks and memory bandwidths. Their overheads are
modest round figures (1.5 ms per step, 20 µs per sequence, 4 ms per request), not measurements.

``cpu-smollm2`` is calibrated to the real vLLM CPU server on this project's machine kind serving
SmolLM2-135M in float32 (figures in ``ground_truth_cpu.json`` beside this file). Derivation, with
F = 2·N·q linear FLOPs and A = attention FLOPs of a prefill of q uncached tokens:

* three TTFTs (29-token prompt 0.18 s; 727 tokens cold 3.1 s; 727 tokens with 640 cached 0.55 s)
  fit TTFT = F / peak + A / (peak · eff) + O with peak ≈ 9.3e10 FLOP/s, eff ≈ 0.215 and a constant
  O ≈ 95 ms, split as 80 ms per request (HTTP, chat template, tokenising) + 5 ms per step + 10 ms
  per sequence;
* decode at 20 tok/s for one stream (50 ms per step) and 50 tok/s over four (80 ms per step)
  gives 10 ms per sequence (80 - 50 = 3 · 10) and 35 ms for reading 538 MB of weights, hence a
  memory bandwidth of ≈ 15.4 GB/s.

The CPU backend keeps the KV cache in 16-bit even for a float32 model (the captured metrics page
shows 364 blocks of 128 tokens in 1 GiB: 23040 B per token = 2·30·3·64·2), and uses 128-token
blocks; its KV space is ``VLLM_CPU_KVCACHE_SPACE`` = 1 GiB.

Adding a profile: add an entry to ``MODELS`` or ``HARDWARE`` below (a frozen value, units as
stated), then name it from a fleet file (``hardware.name`` or ``simulator.profile``).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from backends.config import HardwareFacts, ModelFacts
from backends.sim.roofline import Overheads

GIB = float(1 << 30)

DeviceKind = Literal["gpu", "cpu"]


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """A named accelerator: peak rates plus calibration. Units: bytes, FLOP/s, seconds."""

    facts: HardwareFacts
    memory_bytes: float
    kind: DeviceKind = "gpu"
    attention_efficiency: float = 1.0
    kv_dtype_bytes: float | None = None
    overheads: Overheads = Overheads(request_s=0.004, step_s=0.0015, seq_s=2e-5)


MODELS = MappingProxyType(
    {
        "llama-3-8b": ModelFacts(
            params=8.03e9,
            layers=32,
            hidden_size=4096,
            kv_heads=8,
            head_dim=128,
            dtype_bytes=2,
            max_context=8192,
        ),
        "llama-2-7b": ModelFacts(
            params=6.74e9,
            layers=32,
            hidden_size=4096,
            kv_heads=32,
            head_dim=128,
            dtype_bytes=2,
            max_context=4096,
        ),
        "llama-3-70b": ModelFacts(
            params=70.6e9,
            layers=80,
            hidden_size=8192,
            kv_heads=8,
            head_dim=128,
            dtype_bytes=2,
            max_context=8192,
        ),
        "qwen2.5-7b": ModelFacts(
            params=7.62e9,
            layers=28,
            hidden_size=3584,
            kv_heads=4,
            head_dim=128,
            dtype_bytes=2,
            max_context=32768,
        ),
        # float32 and 2048 tokens of context, as the real CPU server here runs it
        "smollm2-135m": ModelFacts(
            params=134.5e6,
            layers=30,
            hidden_size=576,
            kv_heads=3,
            head_dim=64,
            dtype_bytes=4,
            max_context=2048,
        ),
    }
)

HARDWARE = MappingProxyType(
    {
        "a100-80gb": HardwareProfile(
            facts=HardwareFacts(name="a100-80gb", peak_flops=312e12, mem_bandwidth=2.039e12),
            memory_bytes=80 * GIB,
        ),
        "h100-sxm": HardwareProfile(
            facts=HardwareFacts(name="h100-sxm", peak_flops=989e12, mem_bandwidth=3.35e12),
            memory_bytes=80 * GIB,
        ),
        "l4": HardwareProfile(
            facts=HardwareFacts(name="l4", peak_flops=121e12, mem_bandwidth=300e9),
            memory_bytes=24e9,
        ),
        "cpu-smollm2": HardwareProfile(
            facts=HardwareFacts(
                name="cpu-smollm2",
                peak_flops=9.33e10,
                mem_bandwidth=15.4e9,
                kv_cache_bytes=1 * GIB,
            ),
            memory_bytes=24 * GIB,
            kind="cpu",
            attention_efficiency=0.215,
            kv_dtype_bytes=2,
            overheads=Overheads(request_s=0.080, step_s=0.005, seq_s=0.010),
        ),
    }
)

GENERIC_GPU = HardwareProfile(
    facts=HardwareFacts(name="generic", peak_flops=1e14, mem_bandwidth=1e12),
    memory_bytes=80 * GIB,
)
"""Calibration used when a pool names no known profile: the pool's own facts, 80 GiB, GPU."""


def model_profile(name: str) -> ModelFacts:
    """The named model's facts; KeyError lists the known names."""
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model profile {name!r}; known: {sorted(MODELS)}") from None


def hardware_profile(name: str) -> HardwareProfile:
    """The named hardware profile; KeyError lists the known names."""
    try:
        return HARDWARE[name]
    except KeyError:
        raise KeyError(f"unknown hardware profile {name!r}; known: {sorted(HARDWARE)}") from None
