"""Which wall binds a pool: KV capacity, compute, memory bandwidth, prefill/decode contention.

Pure: the gateway measures, this module decides (no I/O, no clock, no framework).

**KV demand against capacity** (:func:`kv_demand`), per pool, in tokens:

    demand [tokens]   = in flight + working set
    in flight         = Σ over the router's reservations of prompt + expected output tokens
    working set       = distinct prompt blocks the router's prefix index holds for the pool's
                        endpoints × tokens per block (the reuse seen recently: what the
                        engines would have to keep to serve every match the index predicts)
    capacity [tokens] = Σ over the pool's healthy endpoints of the engine's KV blocks × block
                        size, or, for an engine that does not say, the fleet file's
                        ``kv_cache_bytes`` ÷ KV bytes per token (:func:`capacity_tokens`)
    demand ratio      = demand ÷ capacity

KV bytes per token is the seeds' 2 · layers · KV heads · head dim · dtype bytes
(:attr:`routing.formulas.ModelShape.kv_bytes_per_token`; an 8-bit KV cache halves it). An
in-flight prompt's blocks are in the working set too, so the demand is an upper estimate by at
most the in-flight prompts.

**Lost reuse** (:func:`lost_tokens`), per request: the prompt tokens the prefix index said the
chosen endpoint held when the router placed the request (its prediction, at most P − 1: an
engine always computes one prompt token) minus the tokens the engine reports it served from
its cache, when positive: max(0, min(predicted, P − 1) − cached) [tokens]. Summed over the
window's requests, lost ÷ predicted is the share of predicted reuse the engines recomputed.

**The rule** (:func:`binding_wall`), first match wins, over one window of measures
(:class:`WallSignals`; thresholds :class:`WallThresholds`, defaults in brackets):

1. ``kv_capacity`` when the engines throw reuse away or run out of KV:
   a. lost ÷ predicted ≥ ``lost_ratio`` [0.2] over at least ``min_predicted_tokens`` [1,024
      tokens] predicted in the window, and the demand ratio unknown or ≥
      ``plausible_demand`` [0.5] (below it the engines had room for the whole working set
      twice over: the loss is a misprediction — an engine restart, an estimate — not
      eviction); or
   b. the KV cache usage ≥ ``kv_full`` [0.9] and at least ``min_preemptions`` [1] preemption
      in the window; or
   c. the KV cache usage ≥ ``kv_full`` [0.9] and the demand ratio ≥ 1.
   A full cache alone is no wall: engines keep their caches full of reusable blocks.
2. ``compute`` when MFU ≥ ``busy`` [0.5] and MFU ≥ MBU (typically prefill-heavy work).
3. ``memory_bandwidth`` when MBU ≥ ``busy`` [0.5] (typically decode-heavy work).
4. ``prefill_decode_contention`` when the share of SLO-evaluated requests that broke their
   TPOT bound ≥ ``tpot_violations`` [0.1] over at least ``min_evaluated`` [10] requests, and
   prefill is ≥ ``prefill_mix`` [0.3] of the computed tokens (prompt − cached ÷ that + output):
   long prompts stall the running decodes without saturating the hardware.
5. ``none``: no wall shows; the pool has headroom (or too little traffic to tell).

Capacity first: reuse lost to eviction turns into recomputed prefill, so a capacity-bound pool
also looks compute-heavy; the cause is the capacity. Utilisations are fractions in [0, 1],
token counts and preemptions are totals over the window, the KV usage is the highest of the
pool's healthy endpoints.

Worked numbers (the tests check them): 6,000 tokens predicted and 4,500 lost (0.75), a demand
of 9,000 tokens (1,000 in flight + 500 held blocks of 16 tokens) against 4,096 tokens of
capacity (ratio 2.2): ``kv_capacity``.
6,000 predicted, 100 lost, MFU 0.62, MBU 0.30: ``compute``. MFU 0.55 and MBU 0.60:
``memory_bandwidth``. 3 of 20 requests over their TPOT bound with 3,000 prefill and 1,000
decode tokens (prefill 0.75), MFU 0.2, MBU 0.3: ``prefill_decode_contention``.
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
    """The rule's thresholds (module docstring). Units: fractions in [0, 1] for ratios,
    utilisations and usage; tokens; preemptions and requests (counts in the window)."""

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
    """The wall that binds the pool, one of :data:`WALLS` (the rule: module docstring)."""
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
