"""What a simulated engine counts: plain counters and histograms, engine-agnostic.

The engine loop updates an :class:`EngineStats`; :mod:`backends.sim.exposition` turns it into each
engine's real metric names at scrape time. Units: tokens, requests, seconds, FLOP, bytes.
Histogram bucket edges come from the engine's metric table (keyed by the stat names below).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

HISTOGRAMS = (
    "ttft_s",
    "itl_s",
    "tpot_s",
    "e2e_s",
    "queue_s",
    "inference_s",
    "prefill_s",
    "decode_s",
    "prompt_tokens",
    "generation_tokens",
    "max_tokens",
    "n",
    "iteration_tokens",
    "preemptions",
    "prefill_computed_tokens",
)
"""Stat names of the histograms an engine keeps (each metric table picks the ones it exports)."""


class Histogram:
    """Cumulative-ready histogram over fixed upper bounds ``edges`` (+Inf implied)."""

    __slots__ = ("edges", "counts", "sum", "count")

    def __init__(self, edges: Iterable[float]) -> None:
        self.edges = tuple(sorted(edges))
        self.counts = [0] * (len(self.edges) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.edges, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations ≤ bound) pairs, ending with (inf, count)."""
        out: list[tuple[float, int]] = []
        running = 0
        for edge, c in zip((*self.edges, float("inf")), self.counts, strict=True):
            running += c
            out.append((edge, running))
        return out


@dataclass(slots=True)
class EngineStats:
    """Cumulative counters since start, a few recent-window figures, and histograms."""

    histograms: dict[str, Histogram]
    prompt_tokens: int = 0
    prompt_tokens_computed: int = 0
    prompt_tokens_cached: int = 0
    prompt_tokens_transferred: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    host_hits: int = 0  # of prefix_hits, tokens reloaded from the host tier (at admission)
    prompt_tokens_host: int = 0  # of prompt_tokens_cached, reloaded from the host tier
    host_load_bytes: float = 0.0  # KV copied host → device [B]
    host_load_seconds: float = 0.0  # time of those copies [s]
    preemptions: int = 0
    requests_received: int = 0
    finished: Counter[str] = field(default_factory=Counter)
    flops: float = 0.0
    read_bytes: float = 0.0
    write_bytes: float = 0.0
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted: int = 0
    spec_accepted_per_pos: list[int] = field(default_factory=list)
    last_prefill_hit_rate: float = 0.0
    recent_decode: deque[tuple[float, float, int]] = field(default_factory=lambda: deque(maxlen=40))

    @classmethod
    def with_buckets(cls, buckets: Mapping[str, Iterable[float]], spec_k: int = 0) -> EngineStats:
        """Stats keeping a histogram for every stat name in ``buckets``."""
        hists = {name: Histogram(edges) for name, edges in buckets.items()}
        return cls(histograms=hists, spec_accepted_per_pos=[0] * spec_k)

    def observe(self, name: str, value: float) -> None:
        """Record ``value`` in histogram ``name`` if this engine keeps it."""
        hist = self.histograms.get(name)
        if hist is not None:
            hist.observe(value)

    def gen_throughput(self) -> float:
        """Generated tokens per second over the last (up to 40) steps that generated tokens."""
        if not self.recent_decode:
            return 0.0
        start = self.recent_decode[0][0]
        end = self.recent_decode[-1][1]
        tokens = sum(t for _, _, t in self.recent_decode)
        return tokens / (end - start) if end > start else 0.0

    def spec_accept_length(self) -> float:
        """Mean tokens per verify pass (accepted drafts + 1), 0 before the first pass."""
        return 1.0 + self.spec_accepted / self.spec_drafts if self.spec_drafts else 0.0

    def spec_accept_rate(self) -> float:
        """Accepted draft tokens / drafted tokens."""
        return self.spec_accepted / self.spec_draft_tokens if self.spec_draft_tokens else 0.0
