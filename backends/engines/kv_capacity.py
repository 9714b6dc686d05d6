"""The KV capacity of a pool's engines, from the fleet file's facts [tokens].

One engine holds ⌊KV bytes ÷ KV bytes per token⌋ tokens of KV cache, where

* KV bytes per token = 2 · layers · KV heads · head dim · KV element bytes
  (:attr:`routing.formulas.ModelShape.kv_bytes_per_token`; the element is 1 byte with
  ``levers.kv_cache_dtype: fp8``, else the model's ``dtype_bytes``);
* KV bytes = ``hardware.kv_cache_bytes`` when the fleet file gives it, else the engine's share
  of the accelerator's memory minus the weights: fraction · memory − N · dtype bytes, with the
  memory size from the catalogue (:data:`config.builtin_facts.ACCELERATORS`) and the fraction the
  engine's default (:data:`ENGINE_MEMORY_FRACTION`).

Worked: Llama-3-8B fp16 on an 80 GB accelerator under vLLM: 0.9 · 80e9 − 8.03e9 · 2 = 55.94e9 B
of KV at 131,072 B per token = 426,788 tokens; with fp8 KV, 853,576.

A pool without model or hardware facts, or whose accelerator the catalogue does not know and
whose ``kv_cache_bytes`` is not given, has an unknown capacity (None).

A host KV tier (``levers.host_kv_cache``) holds ⌊size ÷ KV bytes per token⌋ more tokens
(:func:`host_tier_tokens`; the host copies are the device's KV, same dtype); an engine's whole
prefix cache is both (:func:`engine_cache_tokens`). Worked: a 128 GB host tier beside
Llama-3-8B fp16 holds 128e9 ÷ 131,072 = 976,562 tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from config.builtin_facts import ACCELERATORS, accelerator_names
from config.fleet_file import Engine, Pool

ENGINE_MEMORY_FRACTION: Mapping[Engine, float] = MappingProxyType({
    Engine.VLLM: 0.9,  # --gpu-memory-utilization's default
    Engine.SGLANG: 0.88,  # --mem-fraction-static's usual value for one GPU
})
"""The share of accelerator memory an engine takes for weights and KV by default."""


def engine_kv_bytes(engine: Engine, memory_bytes: float, weight_bytes: float) -> float:
    """KV bytes [B] an engine keeps on an accelerator of ``memory_bytes``: its default share of
    the memory (:data:`ENGINE_MEMORY_FRACTION`) less the weights, at least 0."""
    return max(0.0, ENGINE_MEMORY_FRACTION[engine] * memory_bytes - weight_bytes)


def engine_kv_tokens(pool: Pool) -> int | None:
    """KV tokens one engine of ``pool`` holds (module docstring), or None when unknown."""
    model, hardware = pool.model, pool.hardware
    if model is None or hardware is None:
        return None
    per_token = model.to_shape(pool.levers.kv_dtype_bytes).kv_bytes_per_token
    kv_bytes = hardware.kv_cache_bytes
    if kv_bytes is None:
        names = accelerator_names(hardware.name)
        if not names:
            return None
        memory = ACCELERATORS[names[0]].memory_bytes
        kv_bytes = engine_kv_bytes(pool.engine, memory, model.to_shape().weight_bytes)
    return int(kv_bytes // per_token)


def host_tier_tokens(pool: Pool) -> int:
    """Tokens one engine's host KV tier holds = ⌊size [B] ÷ KV bytes per token [B/token]⌋ (0
    without a host tier or the model's facts)."""
    tier, model = pool.levers.host_kv_cache, pool.model
    if tier is None or model is None:
        return 0
    return int(tier.size_bytes // model.to_shape(pool.levers.kv_dtype_bytes).kv_bytes_per_token)


def engine_cache_tokens(pool: Pool) -> int | None:
    """Tokens one engine of ``pool`` can keep cached: its device KV and its host tier [tokens],
    None when the device's is unknown."""
    device = engine_kv_tokens(pool)
    return None if device is None else device + host_tier_tokens(pool)
