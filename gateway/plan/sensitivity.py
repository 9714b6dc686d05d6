"""How sensitive a plan's choice is to the simulator's known errors.

The simulator's engines are faster than the real ones in places (docs/benchmarks/fidelity.md:
plain decode 1.6–2.1× faster than the real CPU engine on requests it was not fitted to).
:func:`sensitivity` replays the plan's best candidates again on engines slower than the
datasheet, one :data:`PERTURBATIONS` at a time, and says whether the plan is still the best of
them: a choice that survives errors of that size can be trusted that far; one that does not
is the simulator's guess. docs/planning.md#what-the-prediction-rests-on.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace

from gateway.plan.search import Problem, Replay, Result, run_candidate

PERTURBATIONS: tuple[tuple[str, float, float], ...] = (
    ("decode 2x slower (memory bandwidth / 2)", 1.0, 0.5),
    ("prefill 2x slower (peak FLOP/s / 2)", 0.5, 1.0),
)
"""(what, peak FLOP/s scale, memory bandwidth scale): the simulator's largest measured error
on plain decode, and the same size on prefill."""


@dataclass(frozen=True, slots=True)
class Shift:
    """The top candidates replayed under one perturbation, best first by the objective."""

    what: str
    ranked: tuple[Result, ...]


def sensitivity(problem: Problem, executor: Executor, top: Sequence[Result],
                replay: Replay = run_candidate) -> list[Shift]:
    """``top`` (the plan first) replayed under each perturbation."""
    jobs = []
    for what, flops, bandwidth in PERTURBATIONS:
        slower = replace(problem, brief=replace(problem.brief, flops_scale=flops,
                                                bandwidth_scale=bandwidth))
        for r in top:
            jobs.append((what, executor.submit(replay, slower, r.candidate, 1.0)))
    shifts = []
    for what, _, _ in PERTURBATIONS:
        results = [f.result() for w, f in jobs if w == what]
        ranked = sorted(results, key=lambda r: (-r.score.objective(
            problem.objective, problem.price_per_gpu_hour), r.score.ttft_p99))
        shifts.append(Shift(what, tuple(ranked)))
    return shifts


def verdicts(plan: Result, shifts: Sequence[Shift]) -> list[str]:
    """One line per perturbation: whether the plan is still the best of the candidates."""
    lines = []
    for shift in shifts:
        best = shift.ranked[0]
        mine = next(r for r in shift.ranked if r.candidate == plan.candidate)
        if best.score.good == 0:
            lines.append(f"{shift.what}: none of the {len(shift.ranked)} serves a request "
                         "within the SLO (the SLO, not the choice, is what such engines break)")
        elif best.candidate == plan.candidate:
            lines.append(f"{shift.what}: still the best of {len(shift.ranked)} (goodput "
                         f"{mine.score.goodput:.3f}/s)")
        else:
            lines.append(f"{shift.what}: {best.candidate.label} becomes the best (goodput "
                         f"{best.score.goodput:.3f}/s against the plan's "
                         f"{mine.score.goodput:.3f}/s)")
    return lines
