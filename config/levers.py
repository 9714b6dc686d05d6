"""A pool's ``levers:``: the engine configuration it was launched with, what it relaxes (not
how it is routed).

:class:`Levers` holds prefix caching, chunked prefill (:class:`ChunkedPrefill`), speculative
decoding (:class:`Speculative`) and the capacity levers: ``kv_cache_dtype``
(:data:`KvCacheDtype`; an 8-bit type holds twice the tokens of a 16-bit model's in the same
bytes, :data:`KV_CACHE_DTYPE_BYTES`) and ``host_kv_cache`` (:class:`HostKvCache`: a host-memory
KV tier per engine in GB = 1e9 B, by one of the engine's :data:`HOST_KV_MECHANISMS`; it needs
``prefix_caching``). Checks that need the engine or the prefill/decode pair are the pool's and
the fleet's (:mod:`config.pools`, :mod:`config.fleet`); :func:`config.pools.pool_levers` names
a pool's levers. They render into the engines' launch flags (:mod:`backends.launch.recipes`)
and the simulator models them. See docs/fleet-file.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

from pydantic import model_validator

from config.engines import Engine
from config.strict import PositiveFloat, PositiveInt, Strict


class ChunkedPrefill(Strict):
    """Chunked prefill: long prompts split into chunks of at most ``token_budget`` tokens a
    step."""

    enabled: bool = True
    token_budget: PositiveInt = 2048


class Speculative(Strict):
    """Speculative decoding: ``num_draft_tokens`` (K) drafted per verify step by ``method``."""

    method: Literal["ngram", "eagle", "eagle3", "medusa", "mtp", "draft_model"] = "ngram"
    num_draft_tokens: PositiveInt = 4
    draft_model: str | None = None


KvCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]
"""The KV cache's element type: ``auto`` (the model's dtype) or an 8-bit float. ``fp8`` is
vLLM's name for ``fp8_e4m3``; both engines take ``fp8_e4m3`` and ``fp8_e5m2`` (vLLM 0.32
``CacheDType``, SGLang ``--kv-cache-dtype`` choices)."""

KV_CACHE_DTYPE_BYTES: Mapping[str, float | None] = MappingProxyType(
    {"auto": None, "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0}
)
"""``kv_cache_dtype`` → bytes per KV element [B]; None = the model's ``dtype_bytes``."""

HostKvMechanism = Literal["native", "lmcache", "hicache"]

HOST_KV_MECHANISMS: Mapping[Engine, tuple[HostKvMechanism, ...]] = MappingProxyType({
    Engine.VLLM: ("native", "lmcache"),
    Engine.SGLANG: ("hicache",),
})  # fmt: skip
"""The host-tier mechanisms each engine offers, its default first: vLLM's
``--kv-offloading-backend`` (``native`` CPU offloading, ``lmcache``), SGLang's hierarchical
cache (``hicache``)."""

GB = 1e9
"""Bytes per GB (decimal, as SGLang's ``--hicache-size``; vLLM's ``--kv-offloading-size`` is
in GiB = 2**30 B)."""


class HostKvCache(Strict):
    """A host-memory (CPU DRAM) tier of the KV cache, per engine: prefix-cache blocks evicted
    from device memory stay there (up to ``size_gb``) and a later prefix hit reloads them over
    the host link instead of recomputing them. ``size_gb``: host memory for KV [GB = 1e9 B];
    ``mechanism``: how the engine does it (:data:`HOST_KV_MECHANISMS`; None = the engine's
    default, ``native`` for vLLM, ``hicache`` for SGLang)."""

    size_gb: PositiveFloat
    mechanism: HostKvMechanism | None = None

    @property
    def size_bytes(self) -> float:
        """Host memory for KV [B] = size_gb · 1e9."""
        return self.size_gb * GB


class Levers(Strict):
    """The engine configuration a pool was launched with: what it relaxes, not how it is routed.

    Capacity levers: ``kv_cache_dtype`` (:data:`KvCacheDtype`; an 8-bit type halves the KV
    bytes per token of a 16-bit model, so its KV cache holds twice the tokens) and
    ``host_kv_cache`` (:class:`HostKvCache`; needs ``prefix_caching``: the tier holds prefix
    blocks for reuse)."""

    prefix_caching: bool = False
    chunked_prefill: ChunkedPrefill | None = None
    speculative: Speculative | None = None
    kv_cache_dtype: KvCacheDtype = "auto"
    host_kv_cache: HostKvCache | None = None

    @model_validator(mode="after")
    def _host_tier_needs_prefix_caching(self) -> Levers:
        if self.host_kv_cache is not None and not self.prefix_caching:
            raise ValueError("host_kv_cache holds prefix-cache blocks for reuse: it needs "
                             "prefix_caching: true")
        return self

    @property
    def kv_dtype_bytes(self) -> float | None:
        """Bytes per KV element of ``kv_cache_dtype`` [B]; None = the model's dtype."""
        return KV_CACHE_DTYPE_BYTES[self.kv_cache_dtype]

