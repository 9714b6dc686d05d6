"""MFU and MBU from token counts: the FLOPs and bytes one request costs, and the utilisations.

Notation (units): N parameters; L layers; d hidden size; h_kv KV heads; d_h head dim; w bytes per
weight; b_kv bytes per KV element; P prompt tokens; C of them served from the prefix cache; G
generated (completion) tokens. kv = KV bytes per token = 2 · L · h_kv · d_h · b_kv [B/token]
(one key and one value vector per layer and KV head).

A request is one prefill (the P − C uncached prompt tokens, computed over the C cached ones,
which samples the first output token) then G − 1 decode steps (decode step j = 1 … G − 1
computes one token over a context of P + j − 1 tokens):

* linear FLOPs = 2 · N · (P − C + G − 1)                                     [FLOP]
  (every weight is one multiply-add per computed token)
* attention FLOPs = 4 · L · d · (pairs)                                      [FLOP]
  pairs, prefill = (P − C) · C + (P − C)(P − C + 1) / 2 (causal: new token i attends to the C
  cached tokens and the i before it, itself included); pairs, decode = Σ_j (P + j)
  = (G − 1) · P + (G − 1) · G / 2. Per layer a query/key pair costs 2·d for Q·Kᵀ and 2·d for P·V.
* KV bytes read = kv · (P + Σ_j (P + j)) = kv · (P + (G − 1) · P + (G − 1) · G / 2)   [B]
  (a prefill step reads its sequence's keys and values once, cached ones included; each decode
  step reads the whole context plus the new token). A prefill split into chunks of B tokens
  reads the growing prefix once per chunk: kv · Σ_k min(C + k·B, P).
* KV bytes written = kv · (P − C + G − 1)                                    [B]
* weight bytes read = N · w per engine STEP, shared by every sequence in the step's batch   [B]
  (so bytes depend on how many steps the engine ran, not only on tokens: see below).

Utilisations (ratios in [0, 1] when the inputs are consistent):

    MFU = achieved FLOP/s ÷ peak FLOP/s
    MBU = achieved bytes/s ÷ memory bandwidth [B/s]
    decode bytes/s ≈ (N · w + KV bytes read per step) × steps/s

Worked numbers (tests check them): a 7B-parameter fp16 model (14 GB of weights) decoding one
stream at 100 tokens/s takes 100 steps/s and reads 1.4 TB/s: on a 2 TB/s GPU that is 70 % MBU.
The same 100 tokens/s split over two streams is 50 steps/s: 0.7 TB/s, 35 % MBU. Its MFU at
100 tokens/s is 2 · 7e9 · 100 = 1.4 TFLOP/s, 0.45 % of a 312 TFLOP/s A100.

Engine step counting (:class:`StepCounter`): ridge does not see engine steps; it sees each
stream's decode interval [first token, last token] and its G − 1 decode steps. Streams decoding
at the same time share steps (one batch). So each endpoint keeps the union of the decode
intervals it has seen, and a newly finished request adds only its steps in time NOT yet
covered. With the stream's token times (first token + inter-token gaps) each later token marks
one engine step, and the steps at instants outside the union are new: since every decoding
stream gets a token in every step, each engine step is counted once, by the first finished
stream that saw it (a speculative pass that emits several tokens at once is one step, one
gap). Without token times (non-streamed answers) the G − 1 steps are taken as evenly spread:
new steps = (G − 1) × (uncovered length ÷ interval length), which miscounts when step times
vary (long prefill steps among short decode steps) and when speculation emits several tokens
per step. A prefill adds one more step unless its first token came with another stream's first
token (one prefill step served both: prefills are batched) or, on an engine that mixes prefill
into decode steps (vLLM), fell inside a decode interval; engines that run prefill-only steps
(SGLang) add one per batch of prefills. "Came with" and "inside" allow ``tolerance_s`` of
jitter between streams.

This module is pure: no I/O, no clock, no project imports but ``routing``.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the formulas need of a model. Units: counts, bytes per element."""

    params: float
    layers: int
    hidden_size: int
    kv_heads: int
    head_dim: int
    dtype_bytes: float
    kv_dtype_bytes: float | None = None

    @property
    def kv_bytes_per_token(self) -> float:
        """kv [B/token] = 2 · L · h_kv · d_h · b_kv (b_kv = dtype_bytes unless given)."""
        dtype = self.dtype_bytes if self.kv_dtype_bytes is None else self.kv_dtype_bytes
        return 2.0 * self.layers * self.kv_heads * self.head_dim * dtype

    @property
    def weight_bytes(self) -> float:
        """Weights read once per engine step [B] = N · w."""
        return self.params * self.dtype_bytes


@dataclass(frozen=True, slots=True)
class RequestTokens:
    """One finished request's tokens: prompt P, cached C (≤ P), completion G."""

    prompt: int
    cached: int
    completion: int

    @classmethod
    def clamped(cls, prompt: int | None, cached: int | None, completion: int | None
                ) -> RequestTokens:
        """Unknown counts as 0; C ≤ P − 1 (an engine always computes one prompt token)."""
        p = max(0, prompt or 0)
        g = max(0, completion or 0)
        c = min(max(0, cached or 0), max(0, p - 1))
        return cls(p, c, g)

    @property
    def decode_steps(self) -> int:
        """Decode steps after the prefill's first token: G − 1 (0 without output)."""
        return max(0, self.completion - 1)


@dataclass(frozen=True, slots=True)
class RequestCost:
    """A request's work. Units: FLOP and bytes (weights excluded: they are per step)."""

    prefill_flops: float
    decode_flops: float
    prefill_kv_read: float
    decode_kv_read: float
    prefill_kv_write: float
    decode_kv_write: float

    @property
    def flops(self) -> float:
        return self.prefill_flops + self.decode_flops


def linear_flops(params: float, tokens: float) -> float:
    """Dense-layer FLOPs [FLOP] = 2 · N · tokens."""
    return 2.0 * params * tokens


def attention_flops(shape: ModelShape, pairs: float) -> float:
    """Attention FLOPs [FLOP] = 4 · L · d · (query, key) pairs."""
    return 4.0 * shape.layers * shape.hidden_size * pairs


def prefill_pairs(tokens: RequestTokens) -> float:
    """Causal (query, key) pairs of a prefill of P − C tokens over C cached: q·C + q(q+1)/2."""
    q = tokens.prompt - tokens.cached
    return q * tokens.cached + q * (q + 1) / 2.0


def decode_pairs(tokens: RequestTokens) -> float:
    """Pairs of the G − 1 decode steps: Σ_{j=1}^{G−1} (P + j) = (G−1)·P + (G−1)·G/2."""
    n = tokens.decode_steps
    return n * tokens.prompt + n * (n + 1) / 2.0


def prefill_kv_read_tokens(tokens: RequestTokens, chunk: int | None) -> float:
    """KV positions read by the prefill [tokens]: P in one step, Σ_k min(C + k·B, P) in chunks
    of B tokens."""
    todo = tokens.prompt - tokens.cached
    if todo <= 0:
        return float(tokens.prompt)
    if chunk is None or chunk >= todo:
        return float(tokens.prompt)
    full = todo // chunk  # chunks ending at C + k·B for k = 1 … full
    total = full * tokens.cached + chunk * full * (full + 1) / 2.0
    return total + (tokens.prompt if todo % chunk else 0.0)


def request_cost(shape: ModelShape, tokens: RequestTokens, chunk: int | None = None
                 ) -> RequestCost:
    """FLOPs and KV bytes of one request (formulas in the module docstring)."""
    kv = shape.kv_bytes_per_token
    computed_prompt = tokens.prompt - tokens.cached
    return RequestCost(
        prefill_flops=linear_flops(shape.params, computed_prompt)
        + attention_flops(shape, prefill_pairs(tokens)),
        decode_flops=linear_flops(shape.params, tokens.decode_steps)
        + attention_flops(shape, decode_pairs(tokens)),
        prefill_kv_read=kv * prefill_kv_read_tokens(tokens, chunk),
        decode_kv_read=kv * decode_pairs(tokens),
        prefill_kv_write=kv * computed_prompt,
        decode_kv_write=kv * tokens.decode_steps,
    )


def utilisation(achieved_per_s: float, peak_per_s: float) -> float:
    """MFU or MBU: achieved rate ÷ peak rate (FLOP/s ÷ FLOP/s, or B/s ÷ B/s); 0 for no peak."""
    return achieved_per_s / peak_per_s if peak_per_s > 0 else 0.0


def decode_bytes_per_s(shape: ModelShape, steps_per_s: float, kv_tokens_per_step: float = 0.0
                       ) -> float:
    """Bytes/s while decoding [B/s] = (N · w + kv · KV tokens read per step) × steps/s."""
    return (shape.weight_bytes + shape.kv_bytes_per_token * kv_tokens_per_step) * steps_per_s


# -- engine steps from decode intervals ---------------------------------------------------------


class IntervalUnion:
    """A sorted set of disjoint [start, end] intervals (seconds), for :class:`StepCounter`.
    ``max_intervals`` bounds memory: the oldest intervals are forgotten first."""

    __slots__ = ("_starts", "_ends", "_max")

    def __init__(self, max_intervals: int = 10_000) -> None:
        self._starts: list[float] = []
        self._ends: list[float] = []
        self._max = max_intervals

    def __len__(self) -> int:
        return len(self._starts)

    def covers(self, t: float, tolerance: float = 0.0) -> bool:
        """Whether instant ``t`` lies inside an interval widened by ``tolerance`` [s] each side."""
        i = bisect.bisect_right(self._starts, t + tolerance) - 1
        return i >= 0 and self._ends[i] >= t - tolerance

    def add(self, start: float, end: float) -> list[tuple[float, float]]:
        """Insert [start, end]; returns the parts of it that were not covered before."""
        lo = bisect.bisect_left(self._ends, start)
        hi = bisect.bisect_right(self._starts, end)
        holes, cursor = [], start
        for i in range(lo, hi):
            if self._starts[i] > cursor:
                holes.append((cursor, self._starts[i]))
            cursor = max(cursor, self._ends[i])
        if cursor < end:
            holes.append((cursor, end))
        if lo < hi:
            start, end = min(start, self._starts[lo]), max(end, self._ends[hi - 1])
        self._starts[lo:hi] = [start]
        self._ends[lo:hi] = [end]
        self._trim()
        return holes

    def forget_before(self, t: float) -> None:
        """Drop intervals that ended before ``t``."""
        cut = bisect.bisect_left(self._ends, t)
        del self._starts[:cut], self._ends[:cut]

    def _trim(self) -> None:
        extra = len(self._starts) - self._max
        if extra > 0:
            del self._starts[:extra], self._ends[:extra]


@dataclass(frozen=True, slots=True)
class StepSpan:
    """``steps`` engine steps done evenly over [start, end] (seconds; an instant if equal)."""

    start: float
    end: float
    steps: float


@dataclass(frozen=True, slots=True)
class Steps:
    """Engine steps a request added to its endpoint's count: its prefill's (0 or 1, at the
    first token), and its decodes', where in time they happened."""

    prefill: float
    decode: tuple[StepSpan, ...] = ()

    @property
    def decode_total(self) -> float:
        return sum(span.steps for span in self.decode)


class StepCounter:
    """Counts one endpoint's engine steps from its finished streams (module docstring).

    Parameters: ``prefill_shares_decode_steps`` (the engine runs a prefill inside the running
    decodes' step, as vLLM does; SGLang runs prefill-only steps); ``tolerance_s``, how close
    two first tokens must be to come from one prefill step (a batch of prefills); ``horizon_s``,
    how long intervals and first-token instants are remembered; ``max_intervals`` bounds both.
    """

    def __init__(self, prefill_shares_decode_steps: bool, *, tolerance_s: float = 0.002,
                 horizon_s: float = 600.0, max_intervals: int = 10_000) -> None:
        self._shares = prefill_shares_decode_steps
        self._tolerance = tolerance_s
        self._horizon = horizon_s
        self._max = max_intervals
        self.decoding = IntervalUnion(max_intervals)
        self._firsts: list[float] = []

    def add(self, first_token_at: float, finished_at: float, tokens: RequestTokens,
            gaps: Sequence[float] = ()) -> Steps:
        """The steps one finished request adds; records its decode interval [first token,
        end] (seconds). ``gaps``: its stream's inter-token gaps [s], when measured."""
        prefill = self.prefill_steps(first_token_at, tokens)
        return Steps(prefill, self.decode_steps(first_token_at, finished_at, tokens, gaps))

    def prefill_steps(self, at: float, tokens: RequestTokens) -> float:
        """1 when the prefill that produced a first token at ``at`` ran a step of its own,
        else 0 (batched with another prefill, or inside running decodes' steps)."""
        if tokens.prompt <= 0 and tokens.completion <= 0:
            return 0.0
        batched = self._near_first(at)
        bisect.insort(self._firsts, at)
        if batched or (self._shares and self.decoding.covers(at, self._tolerance)):
            return 0.0
        return 1.0

    def _near_first(self, at: float) -> bool:
        i = bisect.bisect_left(self._firsts, at - self._tolerance)
        return i < len(self._firsts) and self._firsts[i] <= at + self._tolerance

    def decode_steps(self, first: float, end: float, tokens: RequestTokens,
                     gaps: Sequence[float] = ()) -> tuple[StepSpan, ...]:
        """New decode steps of a stream that decoded over [first, end], as spans of time;
        records the interval. Call after :meth:`prefill_steps` for the same request."""
        self._forget(end - self._horizon)
        if gaps:
            times = list(accumulate(gaps, initial=first))[1:]
            fresh = [not self.decoding.covers(t, self._tolerance) for t in times]
            self.decoding.add(first, max(first, end))
            return _runs(times, fresh)
        if tokens.decode_steps == 0:
            return ()
        if end <= first:
            return (StepSpan(first, first, float(tokens.decode_steps)),)
        rate = tokens.decode_steps / (end - first)  # steps per second, taken as even
        return tuple(StepSpan(a, b, (b - a) * rate) for a, b in self.decoding.add(first, end)
                     if b > a)

    def _forget(self, before: float) -> None:
        self.decoding.forget_before(before)
        cut = max(bisect.bisect_left(self._firsts, before), len(self._firsts) - self._max)
        del self._firsts[:max(0, cut)]


def _runs(times: list[float], fresh: list[bool]) -> tuple[StepSpan, ...]:
    """Spans of consecutive step instants ``times`` whose ``fresh`` flag is set."""
    spans: list[StepSpan] = []
    run: list[float] = []
    for t, new in zip(times, fresh, strict=True):
        if new:
            run.append(t)
        elif run:
            spans.append(StepSpan(run[0], run[-1], float(len(run))))
            run = []
    if run:
        spans.append(StepSpan(run[0], run[-1], float(len(run))))
    return tuple(spans)
