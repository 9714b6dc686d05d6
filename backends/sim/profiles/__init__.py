"""Named model and hardware profiles the simulator (and its docs and tests) can refer to.

A *model profile* is a :class:`~config.facts.ModelFacts` for a well-known model
(:data:`MODELS`). A *hardware profile* (:class:`HardwareProfile`, in :data:`HARDWARE`) is a
:class:`~config.facts.HardwareFacts` (peak dense FLOP/s, memory bandwidth B/s) plus what the
roofline cannot know by itself: device memory [B], device kind ("gpu" or "cpu", which picks
the engine's default KV block size), attention efficiency and the fixed overheads [s]
(:mod:`backends.sim.device`).

Every accelerator of the catalogue (:data:`config.builtin_facts.ACCELERATORS`) has a GPU
profile here, keyed by its short alias, with its datasheet's figures and the same modest round
overheads, not measurements; ``generic-gpu`` is had only by asking for it. ``cpu-smollm2`` is
calibrated against the real vLLM CPU server: its fitted constants are data
(``cpu_smollm2.json``, :data:`CPU_SMOLLM2`), rewritten by ``ridge bench calibrate``.

Adding a profile: an entry in ``MODELS`` or ``HARDWARE`` (units as stated), named from a fleet
file. See docs/simulator.md#profiles for the table and the calibration's derivation.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from backends.sim.device import Overheads
from backends.sim.profiles.calibration import load_calibration
from config.builtin_facts import ACCELERATORS
from config.facts import HardwareFacts, ModelFacts

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
