"""The KV capacity of a pool's engines, from the fleet file's facts [tokens].

One engine holds ⌊KV bytes ÷ KV bytes per token⌋ tokens, where KV bytes per token =
2 · layers · KV heads · head dim · KV element bytes
(:attr:`routing.formulas.ModelShape.kv_bytes_per_token`; 1 byte with ``levers.kv_cache_dtype:
fp8``), and KV bytes = ``hardware.kv_cache_bytes``, else fraction · memory − N · dtype bytes
(the catalogue's memory, :data:`config.builtin_facts.ACCELERATORS`, and the engine's
:data:`ENGINE_MEMORY_FRACTION`). Unknown (None) without the facts to compute it.

A host KV tier (``levers.host_kv_cache``) holds ⌊size ÷ KV bytes per token⌋ more tokens
(:func:`host_tier_tokens`); an engine's whole prefix cache is both (:func:`engine_cache_tokens`).
Worked numbers: docs/backends.md#kv-capacity.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from config.builtin_facts import ACCELERATORS, accelerator_names
from config.engines import Engine
from config.pools import Pool

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
