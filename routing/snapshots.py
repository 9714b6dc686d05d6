"""Frozen snapshots the router decides over. Built by the gateway from the registry; never
mutated.

Levers verified against the engines: a pool's ``levers`` are what the fleet file declares; an
endpoint's ``missing_levers`` are the ones of them its engine was found not to run (the
registry's lever check, :mod:`backends.registry.lever_check`). Two views follow, computed once per
snapshot: ``PoolSnapshot.offered``, the declared levers minus those *every* healthy endpoint
lacks (what the lever policy counts on), and ``PoolSnapshot.lacking``, lever → the endpoints
lacking it (the router leaves them out when it sends a request to the pool for that lever).

LoRA adapters: a pool's ``adapters`` are the adapter names its fleet file declares (every
endpoint can serve them); an endpoint's ``adapters`` are those its engine lists as loaded
(``/v1/models`` cards with a ``parent``, read by the registry; empty when not read). A pool
serves its ``models``, its declared adapters and every adapter one of its endpoints lists
(``PoolSnapshot.adapter_names``); which endpoint may take an adapter request is the scheduler
plugin :mod:`routing.scheduler.plugins.adapter_affinity`'s rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from routing.native_value import NativeValue

# Lever names, as they appear in route decisions, headers and metric labels.
PREFIX_CACHE = "prefix_cache"
CHUNKED_PREFILL = "chunked_prefill"
SPECULATIVE = "speculative"
PD_DISAGGREGATION = "pd_disaggregation"
FP8_KV_CACHE = "fp8_kv_cache"  # capacity: 1-byte KV elements, twice the tokens per byte
HOST_KV_CACHE = "host_kv_cache"  # capacity: a host-memory tier of the KV cache
LEVERS = frozenset({PREFIX_CACHE, CHUNKED_PREFILL, SPECULATIVE, PD_DISAGGREGATION,
                    FP8_KV_CACHE, HOST_KV_CACHE})

# Pool roles, as in the fleet file.
MIXED = "mixed"
PREFILL = "prefill"
DECODE = "decode"


class EngineMetrics(NativeValue):
    """One endpoint's engine metrics, normalised across engines. ``None`` = the engine does not say.

    Gauges are instantaneous; ``*_total`` fields are the engine's cumulative counters (since start).
    Units: requests, tokens, a fraction in [0, 1] for ``kv_cache_usage``, FLOPs and bytes.
    ``requests_finished_total``: requests the engine finished, in requests, summed over the
    counter's label sets (finish reasons, data-parallel engines). ``prefix_cache_hits_total``
    counts the tokens served from the device's prefix cache; ``host_cache_hits_total`` those a
    host-memory KV tier served on top (vLLM reports them apart; SGLang's counter already holds
    both tiers, so it leaves this None). The KV cache's size is
    ``kv_blocks_total`` × ``kv_block_size`` (vLLM) or ``kv_capacity_tokens`` (SGLang, which
    states it in tokens).
    """

    FIELDS = ("running", "waiting", "kv_cache_usage", "prefix_cache_queries_total",
              "prefix_cache_hits_total", "host_cache_hits_total", "prompt_tokens_total",
              "generation_tokens_total", "requests_finished_total", "preemptions_total",
              "spec_draft_tokens_total", "spec_accepted_tokens_total", "estimated_flops_total",
              "estimated_read_bytes_total", "estimated_write_bytes_total", "kv_block_size",
              "kv_blocks_total", "kv_capacity_tokens")
    __slots__ = FIELDS

    def __init__(self, running: float | None = None, waiting: float | None = None,
                 kv_cache_usage: float | None = None,
                 prefix_cache_queries_total: float | None = None,
                 prefix_cache_hits_total: float | None = None,
                 host_cache_hits_total: float | None = None,
                 prompt_tokens_total: float | None = None,
                 generation_tokens_total: float | None = None,
                 requests_finished_total: float | None = None,
                 preemptions_total: float | None = None,
                 spec_draft_tokens_total: float | None = None,
                 spec_accepted_tokens_total: float | None = None,
                 estimated_flops_total: float | None = None,
                 estimated_read_bytes_total: float | None = None,
                 estimated_write_bytes_total: float | None = None,
                 kv_block_size: int | None = None, kv_blocks_total: int | None = None,
                 kv_capacity_tokens: int | None = None) -> None:
        self.running: Final = running
        self.waiting: Final = waiting
        self.kv_cache_usage: Final = kv_cache_usage
        self.prefix_cache_queries_total: Final = prefix_cache_queries_total
        self.prefix_cache_hits_total: Final = prefix_cache_hits_total
        self.host_cache_hits_total: Final = host_cache_hits_total
        self.prompt_tokens_total: Final = prompt_tokens_total
        self.generation_tokens_total: Final = generation_tokens_total
        self.requests_finished_total: Final = requests_finished_total
        self.preemptions_total: Final = preemptions_total
        self.spec_draft_tokens_total: Final = spec_draft_tokens_total
        self.spec_accepted_tokens_total: Final = spec_accepted_tokens_total
        self.estimated_flops_total: Final = estimated_flops_total
        self.estimated_read_bytes_total: Final = estimated_read_bytes_total
        self.estimated_write_bytes_total: Final = estimated_write_bytes_total
        self.kv_block_size: Final = kv_block_size
        self.kv_blocks_total: Final = kv_blocks_total
        self.kv_capacity_tokens: Final = kv_capacity_tokens

    @property
    def queued(self) -> float:
        """Requests the engine holds (running + waiting), 0 where unknown."""
        return (self.running or 0.0) + (self.waiting or 0.0)


class EndpointSnapshot(NativeValue):
    """An endpoint as the router sees it at one instant. ``missing_levers``: levers its pool
    declares that its engine was found not to run (empty when unchecked or all there).
    ``adapters``: the LoRA adapters its engine lists as loaded (empty when unknown).
    ``queued``: the engine's running + waiting (``metrics.queued``), computed once: every
    request reads it for every candidate."""

    FIELDS = ("url", "pool", "healthy", "metrics", "missing_levers", "adapters")
    __slots__ = (*FIELDS, "queued")

    def __init__(self, url: str, pool: str, healthy: bool, metrics: EngineMetrics | None = None,
                 missing_levers: frozenset[str] = frozenset(),
                 adapters: frozenset[str] = frozenset()) -> None:
        self.url: Final = url
        self.pool: Final = pool
        self.healthy: Final = healthy
        self.metrics: Final = EngineMetrics() if metrics is None else metrics
        self.missing_levers: Final = missing_levers
        self.adapters: Final = adapters
        self.queued: Final = self.metrics.queued


class PoolSnapshot(NativeValue):
    """A pool as the router sees it at one instant.

    ``levers``: the pool's engine configuration, as names from :data:`LEVERS`. ``pair``: for a
    prefill pool, its decode pool. ``ridge_tokens``: tokens in flight per step at which the
    pool's decoding turns compute-bound (:func:`routing.formulas.decode_ridge_tokens`).
    ``chunk_tokens``: its chunked-prefill token budget, if chunked prefill is on.
    ``draft_tokens``: K, the tokens speculative decoding drafts per verify step (0 without it).
    ``offered`` and ``lacking``: the levers as the engines run them (module docstring).
    ``adapters``: the LoRA adapters the fleet file declares for the pool; ``adapter_names``:
    those and every adapter an endpoint lists (module docstring). ``healthy_endpoints``: the
    healthy ones of ``endpoints``. The last four are computed once, from the others.
    """

    FIELDS = ("name", "engine", "role", "models", "endpoints", "levers", "pair", "ridge_tokens",
              "chunk_tokens", "draft_tokens", "adapters")
    __slots__ = (*FIELDS, "healthy_endpoints", "offered", "lacking", "adapter_names")

    def __init__(self, name: str, engine: str, role: str, models: tuple[str, ...],
                 endpoints: tuple[EndpointSnapshot, ...], levers: frozenset[str] = frozenset(),
                 pair: str | None = None, ridge_tokens: float = 0.0,
                 chunk_tokens: int | None = None, draft_tokens: int = 0,
                 adapters: frozenset[str] = frozenset()) -> None:
        self.name: Final = name
        self.engine: Final = engine
        self.role: Final = role
        self.models: Final = models
        self.endpoints: Final = endpoints
        self.levers: Final = levers
        self.pair: Final = pair
        self.ridge_tokens: Final = ridge_tokens
        self.chunk_tokens: Final = chunk_tokens
        self.draft_tokens: Final = draft_tokens
        self.adapters: Final = adapters
        healthy = tuple(e for e in endpoints if e.healthy)
        lacking = _lacking(levers, endpoints)
        self.healthy_endpoints: Final = healthy
        self.lacking: Final[Mapping[str, frozenset[str]]] = lacking
        self.offered: Final = _offered(levers, healthy, lacking)
        learned = frozenset[str]().union(*(e.adapters for e in endpoints))
        self.adapter_names: Final = adapters | learned

    def serves(self, model: str) -> bool:
        """Whether ``model`` is one of the pool's models or LoRA adapters."""
        return model in self.models or model in self.adapter_names


def _lacking(levers: frozenset[str], endpoints: tuple[EndpointSnapshot, ...]
             ) -> dict[str, frozenset[str]]:
    """Declared lever → URLs of the endpoints whose engine lacks it (only levers some lack)."""
    if not any(e.missing_levers for e in endpoints):
        return {}
    found = {lever: frozenset(e.url for e in endpoints if lever in e.missing_levers)
             for lever in levers}
    return {lever: urls for lever, urls in found.items() if urls}


def _offered(levers: frozenset[str], healthy: tuple[EndpointSnapshot, ...],
             lacking: Mapping[str, frozenset[str]]) -> frozenset[str]:
    """The declared levers some healthy endpoint runs (all of them when none is healthy: the
    pool is out for its health then, and its fallback reasons say so)."""
    if not lacking or not healthy:
        return levers
    gone = {lever for lever, urls in lacking.items() if all(e.url in urls for e in healthy)}
    return levers - gone
