"""Which wall binds a pool: KV capacity, compute, memory bandwidth, prefill/decode contention.

Pure: the gateway measures, this module decides (no I/O, no clock, no framework). The input is
one pool's measures over one window (:class:`WallSignals`): KV demand against capacity
(:func:`kv_demand`, tokens), the reuse the prefix index predicted that the engines recomputed
(:func:`lost_tokens`, tokens), MFU, MBU and KV usage (fractions in [0, 1]), preemptions, TPOT
violations and the prefill share of the computed tokens.

The rule (:func:`binding_wall`, thresholds :class:`WallThresholds`), first match wins:
(1) ``kv_capacity``: reuse lost to eviction, or a full cache that preempts or cannot hold the
demand; (2) ``compute``: MFU busy and ≥ MBU; (3) ``memory_bandwidth``: MBU busy;
(4) ``prefill_decode_contention``: TPOT violations while prefill is a real share of the work;
(5) ``none``. Capacity first: reuse lost to eviction turns into recomputed prefill, so a
capacity-bound pool also looks compute-heavy.

See docs/routing.md#the-binding-wall.
"""

from __future__ import annotations

from dataclasses import dataclass

from routing.formulas import ModelShape

KV_CAPACITY = "kv_capacity"
COMPUTE = "compute"
MEMORY_BANDWIDTH = "memory_bandwidth"
CONTENTION = "prefill_decode_contention"
NO_WALL = "none"
WALLS = (KV_CAPACITY, COMPUTE, MEMORY_BANDWIDTH, CONTENTION, NO_WALL)
"""Every wall :func:`binding_wall` can name (the ``wall`` label of
``ridge_pool_binding_wall``)."""


@dataclass(frozen=True, slots=True)
class WallThresholds:
    """The rule's thresholds (docs/routing.md#the-binding-wall). Units: fractions in [0, 1]
    for ratios, utilisations and usage; tokens; preemptions and requests (counts in the
    window)."""

    lost_ratio: float = 0.2
    min_predicted_tokens: float = 1024.0
    plausible_demand: float = 0.5
    kv_full: float = 0.9
    min_preemptions: float = 1.0
    busy: float = 0.5
    tpot_violations: float = 0.1
    min_evaluated: float = 10.0
    prefill_mix: float = 0.3


DEFAULT_THRESHOLDS = WallThresholds()


@dataclass(frozen=True, slots=True)
class WallSignals:
    """One pool's measures over one window; None = not measured (the engine or the fleet file
    does not say). Units: tokens, requests and preemptions counted in the window; the demand
    ratio dimensionless; utilisations and KV usage fractions in [0, 1]."""

    predicted_tokens: float = 0.0
    lost_tokens: float = 0.0
    kv_demand_ratio: float | None = None
    kv_usage: float | None = None
    preemptions: float | None = None
    mfu: float | None = None
    mbu: float | None = None
    prefill_tokens: float = 0.0
    decode_tokens: float = 0.0
    evaluated: float = 0.0
    tpot_violations: float = 0.0

    def lost_ratio(self, t: WallThresholds = DEFAULT_THRESHOLDS) -> float | None:
        """lost ÷ predicted; None below ``t.min_predicted_tokens`` predicted."""
        if self.predicted_tokens < max(t.min_predicted_tokens, 1e-9):
            return None
        return self.lost_tokens / self.predicted_tokens

    def prefill_share(self) -> float | None:
        """Computed prompt tokens ÷ (those + output tokens); None without either."""
        total = self.prefill_tokens + self.decode_tokens
        return self.prefill_tokens / total if total > 0 else None

    def tpot_violation_ratio(self, t: WallThresholds = DEFAULT_THRESHOLDS) -> float | None:
        """Requests over their TPOT bound ÷ evaluated; None below ``t.min_evaluated``."""
        if self.evaluated < max(t.min_evaluated, 1.0):
            return None
        return self.tpot_violations / self.evaluated


def binding_wall(s: WallSignals, t: WallThresholds = DEFAULT_THRESHOLDS) -> str:
    """The wall that binds the pool, one of :data:`WALLS` (the rule in full:
    docs/routing.md#the-binding-wall)."""
    if _capacity_bound(s, t):
        return KV_CAPACITY
    mfu, mbu = s.mfu or 0.0, s.mbu or 0.0
    if mfu >= t.busy and mfu >= mbu:
        return COMPUTE
    if mbu >= t.busy:
        return MEMORY_BANDWIDTH
    if _contended(s, t):
        return CONTENTION
    return NO_WALL


def _capacity_bound(s: WallSignals, t: WallThresholds) -> bool:
    """Rule 1: reuse lost to eviction (a), or a full cache that preempts (b) or cannot hold
    the demand (c)."""
    lost = s.lost_ratio(t)
    demand = s.kv_demand_ratio
    if lost is not None and lost >= t.lost_ratio and (demand is None
                                                      or demand >= t.plausible_demand):
        return True
    if s.kv_usage is None or s.kv_usage < t.kv_full:
        return False
    preempted = s.preemptions is not None and s.preemptions >= t.min_preemptions
    return preempted or (demand is not None and demand >= 1.0)


def _contended(s: WallSignals, t: WallThresholds) -> bool:
    """Rule 4: decodes over their TPOT bound while prefill is a real share of the work."""
    violations, prefill = s.tpot_violation_ratio(t), s.prefill_share()
    return (violations is not None and violations >= t.tpot_violations
            and prefill is not None and prefill >= t.prefill_mix)


# -- the arithmetic -----------------------------------------------------------------------------


def lost_tokens(predicted: int, cached: int, prompt: int | None) -> tuple[int, int]:
    """(predicted, lost) of one request [tokens]: the prediction capped at P − 1 when the
    prompt length P is known, and max(0, that − cached)."""
    if prompt is not None:
        predicted = min(predicted, max(0, prompt - 1))
    predicted = max(0, predicted)
    return predicted, max(0, predicted - max(0, cached))


def capacity_tokens(kv_cache_bytes: float, shape: ModelShape) -> int:
    """KV cache capacity [tokens] = ⌊KV bytes ÷ KV bytes per token⌋ (6e9 B of Llama-3-8B fp16
    KV at 131,072 B/token → 45,776 tokens)."""
    return int(kv_cache_bytes // shape.kv_bytes_per_token)


@dataclass(frozen=True, slots=True)
class KvDemand:
    """One pool's KV demand [tokens] and capacity [tokens] (None = unknown)."""

    in_flight: float
    working_set: float
    capacity: float | None

    @property
    def demand(self) -> float:
        """in flight + working set [tokens]."""
        return self.in_flight + self.working_set

    @property
    def ratio(self) -> float | None:
        """demand ÷ capacity; None when the capacity is unknown or 0."""
        return self.demand / self.capacity if self.capacity else None


def kv_demand(in_flight_tokens: float, held_blocks: float, block_tokens: int,
              capacity: float | None) -> KvDemand:
    """The pool's :class:`KvDemand`: ``held_blocks`` distinct blocks of ``block_tokens`` tokens
    are the working set."""
    return KvDemand(float(in_flight_tokens), float(held_blocks * block_tokens), capacity)
