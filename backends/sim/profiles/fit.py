"""Fit a calibrated profile's free constants to a real engine's figures (``ridge bench calibrate``).

Inputs, as ``ground_truth_cpu.json`` holds them (:func:`figures_from_truth`): the decode rates
of one stream and of B streams, and the TTFTs of prefills over cached prefixes. Held fixed
(:class:`Machine`): the model's shape, the bandwidth and the attention efficiency. The
simulator's step (:func:`routing.formulas.step_cost`) is roof(work) + step_s + seq_s · n.

:func:`decode_overheads` gives step_s and seq_s from the two decode steps; :func:`prefill_fit`
the peak FLOP/s and request_s minimising the largest relative TTFT error, by nested ternary
searches (:data:`SEARCH_STEPS`; convex while every prefill is compute-bound); :func:`fit`
alternates the two :data:`ROUNDS` times. Figures the model cannot fit (a memory-bound prefill,
negative overheads) raise ValueError. See docs/simulator.md#fitting-a-profile.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backends.sim.profiles.calibration import Calibration
from routing.formulas import HardwareRates, ModelShape, SeqWork, StepCost, step_cost

ROUNDS = 4
SEARCH_STEPS = 80
"""Iterations of each ternary search: the bracket shrinks to (2/3)^80 ≈ 1e-14 of its width."""


@dataclass(frozen=True, slots=True)
class DecodeFigures:
    """One stream's and B streams' decode rates [tokens/s] after ``prompt_tokens`` of prompt."""

    prompt_tokens: int
    max_tokens: int
    single_rate: float
    streams: int
    total_rate: float


@dataclass(frozen=True, slots=True)
class PrefillFigure:
    """A measured TTFT [s] of ``new_tokens`` computed over ``cached_tokens`` from the cache."""

    new_tokens: int
    cached_tokens: int
    ttft_s: float


@dataclass(frozen=True, slots=True)
class Fit:
    """The fitted constants and the largest relative TTFT error they leave."""

    calibration: Calibration
    max_relative_error: float


@dataclass(frozen=True, slots=True)
class Machine:
    """What the fit holds fixed: the model's shape, bandwidth [B/s], attention efficiency."""

    shape: ModelShape
    mem_bandwidth: float
    attention_efficiency: float = 1.0

    def cost(self, peak_flops: float, work: Sequence[SeqWork]) -> StepCost:
        """The roofline of ``work`` at ``peak_flops``, without overheads."""
        return step_cost(self.shape, HardwareRates(peak_flops, self.mem_bandwidth), work,
                         attention_efficiency=self.attention_efficiency)


def figures_from_truth(truth: Mapping[str, Any]) -> tuple[DecodeFigures, list[PrefillFigure]]:
    """The decode figures and the three prefills of a ground-truth file's mapping."""
    one, many = truth["single_stream"], truth["four_concurrent"]
    decode = DecodeFigures(one["prompt_tokens"], one["max_tokens"], one["decode_tokens_per_s"],
                           many["streams"], many["total_decode_tokens_per_s"])
    short, long = truth["short_prompt"], truth["long_prompt"]
    cached = long["cached_tokens"]
    prefills = [
        PrefillFigure(short["prompt_tokens"], 0, short["ttft_s"]),
        PrefillFigure(long["prompt_tokens"], 0, long["cold_ttft_s"]),
        PrefillFigure(long["prompt_tokens"] - cached, cached, long["warm_ttft_s"]),
    ]
    return decode, prefills


def decode_overheads(machine: Machine, peak_flops: float, fig: DecodeFigures
                     ) -> tuple[float, float]:
    """(step_s, seq_s) [s] from the two decode rates (module docstring)."""
    if fig.streams < 2:
        raise ValueError("the decode fit needs at least two concurrent streams")
    context = fig.prompt_tokens + fig.max_tokens // 2
    roof_1 = machine.cost(peak_flops, [SeqWork(1, context)]).seconds
    roof_b = machine.cost(peak_flops, [SeqWork(1, context)] * fig.streams).seconds
    step_1, step_b = 1.0 / fig.single_rate, fig.streams / fig.total_rate
    seq_s = ((step_b - roof_b) - (step_1 - roof_1)) / (fig.streams - 1)
    step_s = step_1 - roof_1 - seq_s
    if seq_s < 0 or step_s < 0:
        raise ValueError(f"decode figures contradict the step model: step_s {step_s:.4g} s, "
                         f"seq_s {seq_s:.4g} s (one stream {step_1 * 1e3:.2f} ms per step, "
                         f"{fig.streams} streams {step_b * 1e3:.2f} ms)")
    return step_s, seq_s


def _argmin(f: Callable[[float], float], low: float, high: float) -> float:
    """The minimiser of a convex ``f`` on [low, high] (ternary search)."""
    for _ in range(SEARCH_STEPS):
        a, b = low + (high - low) / 3, high - (high - low) / 3
        if f(a) <= f(b):
            high = b
        else:
            low = a
    return (low + high) / 2


def prefill_fit(machine: Machine, overhead_s: float, prefills: Sequence[PrefillFigure]
                ) -> tuple[float, float, float]:
    """(peak [FLOP/s], request_s [s], largest relative error) for the prefills' TTFTs, each
    request_s + ``overhead_s`` (step_s + seq_s) + roof (module docstring)."""
    steps = [machine.cost(1.0, [SeqWork(p.new_tokens, p.cached_tokens)]) for p in prefills]
    flops = [s.compute_s for s in steps]  # compute seconds at 1 FLOP/s: (attention-weighted) FLOPs
    memory = [s.memory_s for s in steps]
    times = [p.ttft_s for p in prefills]

    def error(x: float, r: float) -> float:  # x = 1 / peak [s/FLOP], r = request_s [s]
        return max(abs((r + overhead_s + max(x * f, m)) / t - 1.0)
                   for f, m, t in zip(flops, memory, times, strict=True))

    def best_r(x: float) -> float:
        return _argmin(lambda r: error(x, r), 0.0, max(times))

    x = _argmin(lambda x: error(x, best_r(x)), 0.0, max(t / f for t, f in zip(times, flops,
                                                                             strict=True)))
    r = best_r(x)
    bound = [p for p, f, m in zip(prefills, flops, memory, strict=True) if x * f < m]
    if x <= 0 or bound:
        raise ValueError(f"prefills {bound} are memory-bound at the fitted peak: the prefill "
                         "fit assumes compute-bound prefills")
    return 1.0 / x, r, error(x, r)


def fit(machine: Machine, decode: DecodeFigures, prefills: Sequence[PrefillFigure],
        start_peak: float) -> Fit:
    """Every free constant (module docstring), from ``start_peak`` [FLOP/s]."""
    peak, request_s, err = start_peak, 0.0, math.inf
    step_s = seq_s = 0.0
    for _ in range(ROUNDS):
        step_s, seq_s = decode_overheads(machine, peak, decode)
        peak, request_s, err = prefill_fit(machine, step_s + seq_s, prefills)
    constants = Calibration(peak, machine.mem_bandwidth, machine.attention_efficiency,
                            request_s, step_s, seq_s)
    return Fit(constants, err)


def significant(value: float, digits: int = 3) -> float:
    """``value`` rounded to ``digits`` significant digits (0 stays 0)."""
    if value == 0:
        return 0.0
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))


def rounded(constants: Calibration, digits: int = 3) -> Calibration:
    """Every constant to ``digits`` significant digits, as the profile file keeps them."""
    return Calibration(*(significant(v, digits) for v in (
        constants.peak_flops, constants.mem_bandwidth, constants.attention_efficiency,
        constants.request_s, constants.step_s, constants.seq_s)))
