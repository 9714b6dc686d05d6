"""Frozen snapshots the router decides over. Built by the gateway from the registry; never
mutated."""

from __future__ import annotations

from dataclasses import dataclass, field

# Lever names, as they appear in route decisions, headers and metric labels.
PREFIX_CACHE = "prefix_cache"
CHUNKED_PREFILL = "chunked_prefill"
SPECULATIVE = "speculative"
PD_DISAGGREGATION = "pd_disaggregation"
LEVERS = frozenset({PREFIX_CACHE, CHUNKED_PREFILL, SPECULATIVE, PD_DISAGGREGATION})

# Pool roles, as in the fleet file.
MIXED = "mixed"
PREFILL = "prefill"
DECODE = "decode"


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """One endpoint's engine metrics, normalised across engines. ``None`` = the engine does not say.

    Gauges are instantaneous; ``*_total`` fields are the engine's cumulative counters (since start).
    Units: requests, tokens, a fraction in [0, 1] for ``kv_cache_usage``, FLOPs and bytes.
    """

    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    preemptions_total: float | None = None
    spec_draft_tokens_total: float | None = None
    spec_accepted_tokens_total: float | None = None
    estimated_flops_total: float | None = None
    estimated_read_bytes_total: float | None = None
    estimated_write_bytes_total: float | None = None
    kv_block_size: int | None = None
    kv_blocks_total: int | None = None

    @property
    def queued(self) -> float:
        """Requests the engine holds (running + waiting), 0 where unknown."""
        return (self.running or 0.0) + (self.waiting or 0.0)


@dataclass(frozen=True, slots=True)
class EndpointSnapshot:
    """An endpoint as the router sees it at one instant."""

    url: str
    pool: str
    healthy: bool
    metrics: EngineMetrics = field(default_factory=EngineMetrics)
    queued: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """``queued``: the engine's running + waiting (``metrics.queued``), computed once:
        every request reads it for every candidate."""
        object.__setattr__(self, "queued", self.metrics.queued)


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """A pool as the router sees it at one instant.

    ``levers``: the pool's engine configuration, as names from :data:`LEVERS`. ``pair``: for a
    prefill pool, its decode pool. ``ridge_tokens``: tokens in flight per step at which the
    pool's decoding turns compute-bound (:func:`routing.fleet_math.decode_ridge_tokens`).
    ``chunk_tokens``: its chunked-prefill token budget, if chunked prefill is on.
    ``draft_tokens``: K, the tokens speculative decoding drafts per verify step (0 without it).
    """

    name: str
    engine: str
    role: str
    models: tuple[str, ...]
    endpoints: tuple[EndpointSnapshot, ...]
    levers: frozenset[str] = frozenset()
    pair: str | None = None
    ridge_tokens: float = 0.0
    chunk_tokens: int | None = None
    draft_tokens: int = 0
    healthy_endpoints: tuple[EndpointSnapshot, ...] = field(init=False, repr=False,
                                                            compare=False)

    def __post_init__(self) -> None:
        """``healthy_endpoints``: the healthy ones of ``endpoints``, computed once."""
        object.__setattr__(self, "healthy_endpoints",
                           tuple(e for e in self.endpoints if e.healthy))

    def serves(self, model: str) -> bool:
        return model in self.models
