"""Built-in facts of common open models and accelerators, so a fleet file may name them.

A pool's ``model:`` and ``hardware:`` may be a name from these tables (``model: llama-3-8b``,
``hardware: nvidia-h100-sxm``) instead of the full facts; :mod:`config.facts` resolves the
name at load. Names are case-insensitive; models are also found by their Hugging Face
repository id and :data:`MODEL_ALIASES`, accelerators by :data:`ACCELERATOR_ALIASES`. An
unknown name raises :class:`UnknownName`, which lists the closest known names.

Every entry cites its source: a model's ``config.json``, an accelerator's datasheet.
Units: ``peak_flops`` is the dense 16-bit tensor rate without sparsity [FLOP/s],
``mem_bandwidth`` [B/s], ``memory_bytes`` [B, decimal]. A mixture-of-experts model's
``params`` counts every expert (what sits in memory); its FLOPs follow the active parameters
(:func:`active_params`). See docs/fleet-file-schema.md#the-built-in-catalogue.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


class UnknownName(ValueError):
    """A model or accelerator name the catalogue does not know; the message lists close ones."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One model's shape, as its ``config.json`` states it (see the module docstring)."""

    repo: str
    source: str
    params: float
    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool
    max_context: int
    dtype_bytes: float = 2.0
    experts: int = 1
    experts_per_token: int = 1
    attention_bias: bool = False

    def facts(self) -> dict[str, float | int]:
        """The fields of the fleet file's ``model:`` facts (``ModelFacts``)."""
        return {"params": self.params, "layers": self.layers, "hidden_size": self.hidden_size,
                "kv_heads": self.kv_heads, "head_dim": self.head_dim,
                "dtype_bytes": self.dtype_bytes, "max_context": self.max_context}


@dataclass(frozen=True, slots=True)
class AcceleratorSpec:
    """One accelerator's datasheet figures. Units: FLOP/s, B/s, B."""

    source: str
    peak_flops: float
    mem_bandwidth: float
    memory_bytes: float

    def facts(self) -> dict[str, float]:
        """The rates of the fleet file's ``hardware:`` facts (``HardwareFacts``)."""
        return {"peak_flops": self.peak_flops, "mem_bandwidth": self.mem_bandwidth}


def _hf(repo: str) -> str:
    return f"https://huggingface.co/{repo}/blob/main/config.json"


def _llama(repo: str, params: float, layers: int, hidden: int, heads: int, intermediate: int,
           max_context: int, *, kv_heads: int = 8, tied: bool = False) -> ModelSpec:
    """A Llama-3-family shape: 8 KV heads, 128 256 tokens of vocabulary."""
    return ModelSpec(repo, _hf(repo), params, layers, hidden, heads, kv_heads,
                     hidden // heads, intermediate, 128_256, tied, max_context)


def _qwen25(size: str, params: float, layers: int, hidden: int, heads: int, kv_heads: int,
            intermediate: int) -> ModelSpec:
    """A Qwen2.5 instruct shape: head_dim 128, 152 064 tokens, 32 768 of context, q/k/v bias."""
    repo = f"Qwen/Qwen2.5-{size}-Instruct"
    return ModelSpec(repo, _hf(repo), params, layers, hidden, heads, kv_heads, 128,
                     intermediate, 152_064, False, 32_768, attention_bias=True)


def _smollm2(size: str, params: float, layers: int, hidden: int, heads: int, kv_heads: int,
             intermediate: int) -> ModelSpec:
    """A SmolLM2 instruct shape: head_dim 64, 49 152 tokens, tied embeddings, 8 192 of context."""
    repo = f"HuggingFaceTB/SmolLM2-{size}-Instruct"
    return ModelSpec(repo, _hf(repo), params, layers, hidden, heads, kv_heads, 64,
                     intermediate, 49_152, True, 8192)


MODELS: Mapping[str, ModelSpec] = MappingProxyType({
    "llama-3-8b": _llama("meta-llama/Meta-Llama-3-8B-Instruct", 8.03e9, 32, 4096, 32, 14_336,
                         8192),
    "llama-3.1-8b": _llama("meta-llama/Llama-3.1-8B-Instruct", 8.03e9, 32, 4096, 32, 14_336,
                           131_072),
    "llama-3-70b": _llama("meta-llama/Meta-Llama-3-70B-Instruct", 70.6e9, 80, 8192, 64,
                          28_672, 8192),
    "llama-3.1-70b": _llama("meta-llama/Llama-3.1-70B-Instruct", 70.6e9, 80, 8192, 64, 28_672,
                            131_072),
    "llama-3.2-1b": _llama("meta-llama/Llama-3.2-1B-Instruct", 1.24e9, 16, 2048, 32, 8192,
                           131_072, tied=True),
    "llama-3.2-3b": _llama("meta-llama/Llama-3.2-3B-Instruct", 3.21e9, 28, 3072, 24, 8192,
                           131_072, tied=True),
    "deepseek-r1-distill-llama-8b": _llama("deepseek-ai/DeepSeek-R1-Distill-Llama-8B", 8.03e9,
                                           32, 4096, 32, 14_336, 131_072),
    "mistral-7b": ModelSpec("mistralai/Mistral-7B-Instruct-v0.3",
                            _hf("mistralai/Mistral-7B-Instruct-v0.3"), 7.25e9, 32, 4096, 32, 8,
                            128, 14_336, 32_768, False, 32_768),
    "mixtral-8x7b": ModelSpec("mistralai/Mixtral-8x7B-Instruct-v0.1",
                              _hf("mistralai/Mixtral-8x7B-Instruct-v0.1"), 46.7e9, 32, 4096, 32,
                              8, 128, 14_336, 32_000, False, 32_768, experts=8,
                              experts_per_token=2),
    "qwen2.5-7b": _qwen25("7B", 7.62e9, 28, 3584, 28, 4, 18_944),
    "qwen2.5-14b": _qwen25("14B", 14.8e9, 48, 5120, 40, 8, 13_824),
    "qwen2.5-32b": _qwen25("32B", 32.8e9, 64, 5120, 40, 8, 27_648),
    "qwen2.5-72b": _qwen25("72B", 72.7e9, 80, 8192, 64, 8, 29_568),
    "gemma-2-9b": ModelSpec("google/gemma-2-9b-it", _hf("google/gemma-2-9b-it"), 9.24e9, 42,
                            3584, 16, 8, 256, 14_336, 256_000, True, 8192),
    "gemma-2-27b": ModelSpec("google/gemma-2-27b-it", _hf("google/gemma-2-27b-it"), 27.2e9, 46,
                             4608, 32, 16, 128, 36_864, 256_000, True, 8192),
    "phi-3-mini": ModelSpec("microsoft/Phi-3-mini-4k-instruct",
                            _hf("microsoft/Phi-3-mini-4k-instruct"), 3.82e9, 32, 3072, 32, 32,
                            96, 8192, 32_064, False, 4096),
    "smollm2-135m": _smollm2("135M", 134.5e6, 30, 576, 9, 3, 1536),
    "smollm2-360m": _smollm2("360M", 362e6, 32, 960, 15, 5, 2560),
    "smollm2-1.7b": _smollm2("1.7B", 1.71e9, 24, 2048, 32, 32, 8192),
})
"""Model name → shape. Names: family-size, lower case, as the engines' model names often are."""

MODEL_ALIASES: Mapping[str, str] = MappingProxyType({
    "llama3-8b": "llama-3-8b",
    "llama3-70b": "llama-3-70b",
    "mistral-7b-v0.3": "mistral-7b",
    "phi-3-mini-4k": "phi-3-mini",
})
"""Short alias → model name (each model's repository id is an alias too)."""

_NVIDIA = "https://www.nvidia.com/en-us/data-center"

ACCELERATORS: Mapping[str, AcceleratorSpec] = MappingProxyType({
    # AWS-only part without an NVIDIA datasheet: 24 GB of GDDR6 at 600 GB/s as the G5 page
    # and the A10 share; the dense BF16 tensor rate is the one cloud providers quote for it,
    # 70 TFLOP/s (80 SMs at 1.71 GHz, 512 FLOP/clock/SM with FP32 accumulate), not the A10's 125
    "nvidia-a10g": AcceleratorSpec("https://aws.amazon.com/ec2/instance-types/g5/",
                                   70e12, 600e9, 24e9),
    # 242 TFLOP/s BF16 with sparsity on the datasheet; 300 GB/s; 24 GB
    "nvidia-l4": AcceleratorSpec(f"{_NVIDIA}/l4/", 121e12, 300e9, 24e9),
    # 362.05 dense (733 with sparsity); 864 GB/s; 48 GB
    "nvidia-l40s": AcceleratorSpec(f"{_NVIDIA}/l40s/", 362.05e12, 864e9, 48e9),
    # 312 TFLOP/s BF16 dense (624 with sparsity); 1,555 GB/s (40 GB) and 2,039 GB/s (80 GB)
    "nvidia-a100-40gb-sxm": AcceleratorSpec(
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
        "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf", 312e12, 1.555e12, 40e9),
    "nvidia-a100-80gb-sxm": AcceleratorSpec(
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
        "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf", 312e12, 2.039e12, 80e9),
    # 1,979 TFLOP/s BF16 with sparsity (SXM), 1,513 (PCIe); 3.35 TB/s and 2 TB/s; 80 GB
    "nvidia-h100-sxm": AcceleratorSpec(f"{_NVIDIA}/h100/", 989e12, 3.35e12, 80e9),
    "nvidia-h100-pcie": AcceleratorSpec(f"{_NVIDIA}/h100/", 756e12, 2.0e12, 80e9),
    # the H100's compute with 141 GB of HBM3e at 4.8 TB/s
    "nvidia-h200-sxm": AcceleratorSpec(f"{_NVIDIA}/h200/", 989e12, 4.8e12, 141e9),
    # DGX B200: 8 GPUs, 1,440 GB and 64 TB/s in all; 4.5 PFLOP/s FP16/BF16 with sparsity each
    "nvidia-b200": AcceleratorSpec(f"{_NVIDIA}/dgx-b200/", 2.25e15, 8e12, 180e9),
    # 1,307.4 TFLOP/s FP16/BF16 dense (2,614.9 with sparsity); 5.3 TB/s; 192 GB HBM3
    "amd-mi300x": AcceleratorSpec(
        "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/"
        "amd-instinct-mi300x-data-sheet.pdf", 1307.4e12, 5.3e12, 192e9),
})
"""Accelerator name → datasheet figures. Names: vendor-part[-memory][-form factor]."""

ACCELERATOR_ALIASES: Mapping[str, str] = MappingProxyType({
    "a10g": "nvidia-a10g",
    "l4": "nvidia-l4",
    "l40s": "nvidia-l40s",
    "a100-40gb": "nvidia-a100-40gb-sxm",
    "a100-80gb": "nvidia-a100-80gb-sxm",
    "h100-sxm": "nvidia-h100-sxm",
    "h100-pcie": "nvidia-h100-pcie",
    "h200": "nvidia-h200-sxm",
    "h200-sxm": "nvidia-h200-sxm",
    "b200": "nvidia-b200",
    "mi300x": "amd-mi300x",
})
"""Alias → accelerator name. ``h100`` and ``a100`` alone are ambiguous and not aliases."""


def _model_index() -> dict[str, str]:
    index = {spec.repo.lower(): name for name, spec in MODELS.items()}
    index.update(MODEL_ALIASES)
    index.update({name: name for name in MODELS})
    return index


def _resolve(kind: str, name: str, index: Mapping[str, str]) -> str:
    key = name.strip().lower()
    if key in index:
        return index[key]
    close = difflib.get_close_matches(key, list(index), n=5, cutoff=0.5)
    hint = f"; close matches: {', '.join(close)}" if close else ""
    known = sorted(set(index.values()))
    raise UnknownName(f"unknown {kind} {name!r}{hint}; known: {', '.join(known)}")


def model_name(name: str) -> str:
    """The catalogue name of model ``name`` (a name, repository id or alias, any case)."""
    return _resolve("model", name, _model_index())


def accelerator_name(name: str) -> str:
    """The catalogue name of accelerator ``name`` (a name or alias, any case)."""
    index = {**ACCELERATOR_ALIASES, **{n: n for n in ACCELERATORS}}
    return _resolve("accelerator", name, index)


def find_model(name: str) -> ModelSpec:
    """Model ``name``'s shape; :class:`UnknownName` lists close matches."""
    return MODELS[model_name(name)]


def find_accelerator(name: str) -> AcceleratorSpec:
    """Accelerator ``name``'s figures; :class:`UnknownName` lists close matches."""
    return ACCELERATORS[accelerator_name(name)]


def accelerator_names(name: str) -> tuple[str, ...]:
    """Every name accelerator ``name`` goes by (its catalogue name first, then its aliases);
    ``()`` when the catalogue does not know it."""
    try:
        canonical = accelerator_name(name)
    except UnknownName:
        return ()
    return (canonical, *(a for a, n in ACCELERATOR_ALIASES.items() if n == canonical))


def layer_params(spec: ModelSpec) -> float:
    """Parameters counted from the shape: per layer, attention d·h·d_h (q) + 2·d·h_kv·d_h (k, v)
    + h·d_h·d (o) [+ biases h·d_h + 2·h_kv·d_h], a gated MLP 3·d·I per expert [+ a d·E router],
    two norms 2·d; then the embeddings V·d (twice when not tied) and a final norm d."""
    d, q, kv = spec.hidden_size, spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
    attention = 2 * d * q + 2 * d * kv + (q + 2 * kv if spec.attention_bias else 0)
    router = d * spec.experts if spec.experts > 1 else 0
    mlp = spec.experts * 3 * d * spec.intermediate_size + router
    embeddings = spec.vocab_size * d * (1 if spec.tied_embeddings else 2)
    return float(spec.layers * (attention + mlp + 2 * d) + embeddings + d)


def active_params(spec: ModelSpec) -> float:
    """Parameters one token runs through: ``params`` less the experts it is not routed to."""
    idle = spec.experts - spec.experts_per_token
    return spec.params - spec.layers * idle * 3 * spec.hidden_size * spec.intermediate_size
