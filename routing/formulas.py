"""Fleet arithmetic: the roofline, FLOPs and bytes per token, MFU/MBU, speculation, goodput.

The field's napkin formulas, once, for the lever policy, the telemetry and the simulator alike;
each function's docstring gives its formula with units.

Notation: N parameters; L layers; d hidden size; h_kv KV heads; d_h head dim; w bytes per
weight; b_kv bytes per KV element (= w unless the KV cache has its own dtype); kv KV bytes per
token; P prompt tokens, C of them served from the prefix cache; G generated tokens; K draft
tokens per speculative pass, α a draft's acceptance probability. Units: FLOP, bytes [B],
seconds [s], tokens; utilisations are fractions of peak; SLO bounds are seconds.

Pure: no I/O, no clock, no imports of the project but :mod:`routing.values`.

See docs/routing.md#the-field-formulas.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from routing.native_value import NativeValue
from routing.values import value

# -- model and hardware -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the formulas need of a model. Units: counts; bytes per weight (``dtype_bytes``)
    and per KV element (``kv_dtype_bytes``, None = ``dtype_bytes``)."""

    params: float
    layers: int
    hidden_size: int
    kv_heads: int
    head_dim: int
    dtype_bytes: float
    kv_dtype_bytes: float | None = None

    @property
    def kv_bytes_per_token(self) -> float:
        """kv [B/token] = 2 · L · h_kv · d_h · b_kv."""
        dtype = self.dtype_bytes if self.kv_dtype_bytes is None else self.kv_dtype_bytes
        return 2.0 * self.layers * self.kv_heads * self.head_dim * dtype

    @property
    def weight_bytes(self) -> float:
        """Weights read once per engine step [B] = N · w."""
        return self.params * self.dtype_bytes


@dataclass(frozen=True, slots=True)
class HardwareRates:
    """One accelerator's peak rates: dense FLOP/s and memory bandwidth [B/s]."""

    peak_flops: float
    mem_bandwidth: float

    @property
    def ridge_point(self) -> float:
        """[FLOP/B] = peak FLOP/s ÷ bandwidth B/s."""
        return ridge_point(self.peak_flops, self.mem_bandwidth)


# -- FLOPs ------------------------------------------------------------------------------------


def linear_flops(params: float, tokens: float) -> float:
    """Dense-layer FLOPs [FLOP] = 2 · N · tokens."""
    return 2.0 * params * tokens


def causal_pairs(new_tokens: float, context: float) -> float:
    """(query, key) pairs of q new tokens over c cached ones, causally: q · c + q (q + 1) / 2."""
    return new_tokens * context + new_tokens * (new_tokens + 1) / 2.0


def attention_flops(shape: ModelShape, pairs: float) -> float:
    """Attention FLOPs [FLOP] = 4 · L · d · (query, key) pairs."""
    return 4.0 * shape.layers * shape.hidden_size * pairs


# -- the roofline -----------------------------------------------------------------------------


def ridge_point(peak_flops: float, mem_bandwidth: float) -> float:
    """FLOP/B at which compute time equals memory time = FLOP/s ÷ B/s."""
    return peak_flops / mem_bandwidth


def decode_ridge_tokens(peak_flops: float, mem_bandwidth: float, dtype_bytes: float) -> float:
    """Tokens per decode step at which decoding turns compute-bound = ridge point × w / 2."""
    return ridge_point(peak_flops, mem_bandwidth) * dtype_bytes / 2.0


def host_reload_ratio(kv_bytes_per_token: float, host_link_bandwidth: float, params: float,
                      peak_flops: float) -> float:
    """What reloading a prefix token's KV from a host tier costs against recomputing it, in
    (0, 1]: (kv [B/token] ÷ host link [B/s]) ÷ (2 · N [FLOP/token] ÷ peak [FLOP/s]), at most 1
    (an engine would recompute rather than reload slower). Prefill at peak FLOP/s is the
    fastest recomputation, so this is the ratio's upper bound (worked example:
    docs/routing.md#the-roofline-and-one-engine-step)."""
    reload_s = kv_bytes_per_token / host_link_bandwidth
    recompute_s = 2.0 * params / peak_flops
    return min(1.0, reload_s / recompute_s)


@dataclass(frozen=True, slots=True)
class SeqWork:
    """One sequence's share of a step: ``new_tokens`` (q) computed over ``context`` (c) cached."""

    new_tokens: int
    context: int


@dataclass(frozen=True, slots=True)
class StepCost:
    """A step's work and time. Units: FLOP, bytes, seconds."""

    linear_flops: float
    attention_flops: float
    read_bytes: float
    write_bytes: float
    compute_s: float
    memory_s: float
    seconds: float

    @property
    def flops(self) -> float:
        return self.linear_flops + self.attention_flops

    @property
    def bound(self) -> str:
        """Which roof binds this step: "compute" or "memory"."""
        return "compute" if self.compute_s >= self.memory_s else "memory"


IDLE_STEP = StepCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


def step_cost(shape: ModelShape, rates: HardwareRates, work: Sequence[SeqWork], *,
              attention_efficiency: float = 1.0, step_overhead_s: float = 0.0,
              seq_overhead_s: float = 0.0) -> StepCost:
    """The roofline cost of one engine step over ``work``, sequence i computing q_i new tokens
    over c_i cached ones:

        linear = 2·N·Σ q_i ;  attention = 4·L·d·Σ (q_i·c_i + q_i (q_i + 1) / 2)     [FLOP]
        read = N·w + kv·Σ (c_i + q_i) ;  written = kv·Σ q_i                         [B]
        compute = linear / peak + attention / (peak · attention_efficiency)         [s]
        memory = (read + written) / bandwidth                                       [s]
        seconds = max(compute, memory) + step overhead + seq overhead × batch       [s]

    ``attention_efficiency``: fraction of peak the attention kernels reach (≤ 1); overheads [s]
    per step and per sequence in the batch. No work costs nothing."""
    if not work:
        return IDLE_STEP
    kv = shape.kv_bytes_per_token
    tokens = sum(w.new_tokens for w in work)
    lin = linear_flops(shape.params, tokens)
    att = sum(attention_flops(shape, causal_pairs(w.new_tokens, w.context)) for w in work)
    read = shape.weight_bytes + kv * sum(w.context + w.new_tokens for w in work)
    write = kv * tokens
    peak = rates.peak_flops
    compute_s = lin / peak + att / (peak * attention_efficiency)
    memory_s = (read + write) / rates.mem_bandwidth
    over = step_overhead_s + seq_overhead_s * len(work)
    return StepCost(lin, att, read, write, compute_s, memory_s, max(compute_s, memory_s) + over)


# -- one request's cost -----------------------------------------------------------------------


class RequestTokens(NativeValue):
    """One finished request's tokens: prompt P, cached C (≤ P), completion G."""

    FIELDS = ("prompt", "cached", "completion")
    __slots__ = FIELDS

    def __init__(self, prompt: int, cached: int, completion: int) -> None:
        self.prompt: Final = prompt
        self.cached: Final = cached
        self.completion: Final = completion

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


class RequestCost(NativeValue):
    """A request's work. Units: FLOP and bytes (weights excluded: they are per step)."""

    FIELDS = ("prefill_flops", "decode_flops", "prefill_kv_read", "decode_kv_read",
              "prefill_kv_write", "decode_kv_write")
    __slots__ = FIELDS

    def __init__(self, prefill_flops: float, decode_flops: float, prefill_kv_read: float,
                 decode_kv_read: float, prefill_kv_write: float, decode_kv_write: float) -> None:
        self.prefill_flops: Final = prefill_flops
        self.decode_flops: Final = decode_flops
        self.prefill_kv_read: Final = prefill_kv_read
        self.decode_kv_read: Final = decode_kv_read
        self.prefill_kv_write: Final = prefill_kv_write
        self.decode_kv_write: Final = decode_kv_write

    @property
    def flops(self) -> float:
        return self.prefill_flops + self.decode_flops


def prefill_pairs(tokens: RequestTokens) -> float:
    """Causal pairs of a prefill of P − C tokens over C cached: (P − C)·C + (P − C)(P − C + 1)/2."""
    return causal_pairs(tokens.prompt - tokens.cached, tokens.cached)


def decode_pairs(tokens: RequestTokens) -> float:
    """Pairs of the G − 1 decode steps: Σ_{j=1}^{G−1} (P + j) = (G−1)·P + (G−1)·G/2."""
    return causal_pairs(tokens.decode_steps, tokens.prompt)


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
    """FLOPs and KV bytes of one request: a prefill of P − C tokens over C cached (it samples
    the first output token), then G − 1 decode steps. FLOPs = linear + attention of
    :func:`prefill_pairs` and :func:`decode_pairs` [FLOP]; KV read = kv ×
    (:func:`prefill_kv_read_tokens` + decode pairs), KV written = kv × (P − C + G − 1) [B];
    weights are per step, not counted. ``chunk``: the prefill chunk size [tokens], None =
    whole prompts (docs/routing.md#a-requests-cost)."""
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


# -- speculative decoding ---------------------------------------------------------------------


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """E[tokens per target pass] = (1 − α^(K+1)) / (1 − α); K + 1 when α = 1."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def accepted_pmf(alpha: float, k: int) -> list[float]:
    """P(A = a) for a = 0..K: the truncated geometric law of accepted drafts."""
    probs = [alpha**a * (1.0 - alpha) for a in range(k)]
    probs.append(alpha**k)
    return probs


def net_speedup(alpha: float, k: int, draft_cost: float) -> float:
    """Memory-bound speed-up over plain decoding ≈ E / (1 + c·K) (dimensionless)."""
    return expected_tokens_per_pass(alpha, k) / (1.0 + draft_cost * k)


def spec_batch_limit(ridge_tokens: float, draft_tokens: int, fraction: float) -> float:
    """The decode batch [sequences per endpoint] at which speculation's verify tokens, K + 1
    per sequence, reach ``fraction`` of the decode ridge [tokens per step]:
    fraction · ridge tokens ÷ (K + 1)."""
    return fraction * ridge_tokens / (max(draft_tokens, 0) + 1)


# -- utilisation ------------------------------------------------------------------------------


def utilisation(achieved_per_s: float, peak_per_s: float) -> float:
    """Achieved rate ÷ peak rate (FLOP/s ÷ FLOP/s, or B/s ÷ B/s); 0 for no peak."""
    return achieved_per_s / peak_per_s if peak_per_s > 0 else 0.0


def mfu(flops_per_s: float, rates: HardwareRates) -> float:
    """Model FLOPs utilisation = achieved FLOP/s ÷ peak FLOP/s."""
    return utilisation(flops_per_s, rates.peak_flops)


def mbu(bytes_per_s: float, rates: HardwareRates) -> float:
    """Memory bandwidth utilisation = achieved B/s ÷ memory bandwidth B/s."""
    return utilisation(bytes_per_s, rates.mem_bandwidth)


def decode_bytes_per_s(shape: ModelShape, steps_per_s: float, kv_tokens_per_step: float = 0.0
                       ) -> float:
    """Bytes/s while decoding [B/s] = (N · w + kv · KV tokens read per step) × steps/s."""
    return (shape.weight_bytes + shape.kv_bytes_per_token * kv_tokens_per_step) * steps_per_s


# -- goodput ----------------------------------------------------------------------------------

TTFT = "ttft"
TPOT = "tpot"
E2E = "e2e"
ERROR = "error"
SLO_NAMES = (TTFT, TPOT, E2E, ERROR)
"""Every name a verdict can report (the ``slo`` label of ``ridge_slo_violations_total``)."""


@value
class Bounds:
    """Upper bounds [s]; None = no bound."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def over(self, base: Bounds) -> Bounds:
        """These bounds, each unset one taken from ``base``."""
        return Bounds(
            ttft_s=self.ttft_s if self.ttft_s is not None else base.ttft_s,
            tpot_s=self.tpot_s if self.tpot_s is not None else base.tpot_s,
            e2e_s=self.e2e_s if self.e2e_s is not None else base.e2e_s,
        )

    def by_name(self) -> dict[str, float]:
        """The set bounds by SLO name (``ttft``, ``tpot``, ``e2e``)."""
        pairs = ((TTFT, self.ttft_s), (TPOT, self.tpot_s), (E2E, self.e2e_s))
        return {name: value for name, value in pairs if value is not None}


class Measured(NativeValue):
    """What was measured of one finished request [s]; None = not measured."""

    FIELDS = ("status", "e2e_s", "ttft_s", "tpot_s")
    __slots__ = FIELDS

    def __init__(self, status: int, e2e_s: float, ttft_s: float | None = None,
                 tpot_s: float | None = None) -> None:
        self.status: Final = status
        self.e2e_s: Final = e2e_s
        self.ttft_s: Final = ttft_s
        self.tpot_s: Final = tpot_s


class Verdict(NativeValue):
    """``evaluated``: the request counts toward goodput at all; ``violated``: bound names."""

    FIELDS = ("evaluated", "violated")
    __slots__ = FIELDS

    def __init__(self, evaluated: bool, violated: tuple[str, ...] = ()) -> None:
        self.evaluated: Final = evaluated
        self.violated: Final = violated

    @property
    def good(self) -> bool:
        return self.evaluated and not self.violated


NOT_EVALUATED = Verdict(evaluated=False)
MET = Verdict(evaluated=True)


def evaluate(bounds: Bounds, measured: Measured) -> Verdict:
    """Which of ``bounds`` the request broke (a bound is met when the figure is ≤ it; an unset
    bound or a figure not measured is never broken). Status ≥ 500 breaks ``error``; any other
    status outside 2xx is not evaluated (docs/routing.md#goodput)."""
    if measured.status >= 500:
        return Verdict(True, (ERROR,))
    if not 200 <= measured.status < 300:
        return NOT_EVALUATED
    if bounds.ttft_s is None and bounds.tpot_s is None and bounds.e2e_s is None:
        return MET
    figures = {TTFT: measured.ttft_s, TPOT: measured.tpot_s, E2E: measured.e2e_s}
    violated = tuple(
        name for name, bound in bounds.by_name().items()
        if (value := figures[name]) is not None and value > bound
    )
    return Verdict(True, violated)


def goodput_rate(good_requests: float, window_s: float) -> float:
    """Goodput [requests/s] = requests that met every bound ÷ window [s]; 0 for no window."""
    return good_requests / window_s if window_s > 0 else 0.0
