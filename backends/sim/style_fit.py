"""Fitting how a model's answers copy and repeat (:class:`backends.sim.answers.Style`) to a real
n-gram engine's speculation counters.

Matched per request kind: drafts per answer token and accepted drafts per answer token (the
share of the answer that came free). :func:`spec_figures` computes both for a style by running
the simulator's own drafting (:class:`backends.sim.ngram.NgramIndex`) against its own answers
over ``seeds`` seeds. :func:`fit_style` descends a grid of ``repeat_share``, ``repeat_run``
and ``repeat_after`` (:data:`SHARES`, :data:`RUNS`, :data:`AFTERS`) on the free-text groups,
then fits ``slip`` on the copy requests; :func:`fitted` does it from a ground-truth file.

Parameters: ``k`` (draft tokens), ``window`` (min_n, max_n), ``seeds``.
See docs/simulator.md#fitting-the-answer-style.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from backends.sim.answers import Answer, Style
from backends.sim.ngram import NgramIndex, accepted_drafts

RUNS: tuple[float, ...] = (3.0, 4.0, 5.0, 6.0, 8.0)
"""The mean repeat run lengths [tokens] the fit tries."""
AFTERS: tuple[int, ...] = (0, 25, 50, 75, 100, 125, 150)
"""The answer tokens before the first repeat [tokens] the fit tries."""


@dataclass(frozen=True, slots=True)
class SpecFigures:
    """Speculation counters per answer token, over a set of requests."""

    drafts_per_token: float
    accepted_per_token: float


@dataclass(frozen=True, slots=True)
class Case:
    """One request: its prompt tokens and how many answer tokens it generated."""

    prompt: tuple[str, ...]
    tokens: int


def _one(case: Case, style: Style, seed: int, k: int, window: tuple[int, int]
         ) -> tuple[int, int]:
    """(verify passes with drafts, accepted drafts) for one answer."""
    index = NgramIndex(*window)
    index.extend(case.prompt)
    answer = Answer.for_prompt(case.prompt, random.Random(seed), style)
    made, passes, accepted, drafts = 0, 0, 0, list[str]()
    while made < case.tokens:
        passes += bool(drafts)
        got = accepted_drafts(drafts, answer.tokens(made, len(drafts)))
        new = answer.tokens(made, got + 1)
        accepted, made = accepted + got, made + len(new)
        index.extend(new)
        left = case.tokens - made - 1
        drafts = index.propose(min(k, left)) if left > 0 else []
    return passes, accepted


def spec_figures(cases: Sequence[Case], style: Style, seeds: int = 8, k: int = 4,
                 window: tuple[int, int] = (2, 4)) -> SpecFigures:
    """The figures the simulator gives ``cases`` with ``style`` (module docstring)."""
    passes = accepted = tokens = 0
    for case in cases:
        for seed in range(seeds):
            p, a = _one(case, style, seed, k, window)
            passes, accepted, tokens = passes + p, accepted + a, tokens + case.tokens
    return SpecFigures(passes / max(tokens, 1), accepted / max(tokens, 1))


@dataclass(frozen=True, slots=True)
class MeasuredGroup:
    """A group of requests and the figures the real engine gave them."""

    cases: tuple[Case, ...]
    figures: SpecFigures


def _error(got: SpecFigures, want: SpecFigures) -> float:
    """Squared differences of the two figures [per token]: absolute, so the groups where
    speculation gains most (long answers) weigh most."""
    return ((got.drafts_per_token - want.drafts_per_token) ** 2
            + (got.accepted_per_token - want.accepted_per_token) ** 2)


def free_error(style: Style, free: Sequence[MeasuredGroup], seeds: int = 8) -> float:
    """The squared differences of ``style``'s figures, summed over the free-text groups."""
    return sum(_error(spec_figures(g.cases, style, seeds), g.figures) for g in free)


SHARES: tuple[float, ...] = tuple(i / 100 for i in range(0, 91, 3))
"""The repeat shares the fit tries."""


def _neighbours(at: tuple[int, int, int]) -> list[tuple[int, int, int]]:
    sizes = (len(SHARES), len(RUNS), len(AFTERS))
    out = []
    for axis in range(3):
        for step in (-1, 1):
            moved = list(at)
            moved[axis] += step
            if 0 <= moved[axis] < sizes[axis]:
                out.append((moved[0], moved[1], moved[2]))
    return out


def _free_fit(free: Sequence[MeasuredGroup], seeds: int) -> Style:
    """Grid descent from several starts (every fifth share × every onset, the middle run
    length): from each, move to the best neighbouring point while it fits better, until no
    neighbour does (one step along any axis); the best of the ends."""
    def style(at: tuple[int, int, int]) -> Style:
        return Style(0.0, SHARES[at[0]], RUNS[at[1]], AFTERS[at[2]])

    error: dict[tuple[int, int, int], float] = {}

    def cost(at: tuple[int, int, int]) -> float:
        if at not in error:
            error[at] = free_error(style(at), free, seeds)
        return error[at]

    def descend(at: tuple[int, int, int]) -> tuple[int, int, int]:
        while (best := min(_neighbours(at), key=cost)) and cost(best) < cost(at):
            at = best
        return at

    starts = [(i, len(RUNS) // 2, j) for i in range(0, len(SHARES), 5)
              for j in range(len(AFTERS))]
    return style(min((descend(at) for at in starts), key=cost))


def fit_style(free: Sequence[MeasuredGroup], copy: MeasuredGroup, seeds: int = 8) -> Style:
    """The style whose figures come closest to the real engine's (module docstring):
    ``repeat_share``, ``repeat_run`` and ``repeat_after`` on the free-text groups (answers of
    different lengths tell when repeating starts), then ``slip`` on the copy requests."""
    best = _free_fit(free, seeds)
    slips = [i / 100 for i in range(51)]
    return min((replace(best, slip=s) for s in slips),
               key=lambda st: abs(spec_figures(copy.cases, st, seeds).accepted_per_token
                                  - copy.figures.accepted_per_token))


SHORT = 96
"""[tokens] The calibration's short answers (``max_tokens``): small models start repeating
themselves only later."""


def measured(truth: Mapping[str, Any], kind: str, short: bool | None = None) -> MeasuredGroup:
    """The ground truth's requests of ``kind`` (``ground_truth_ngram.json``'s ``cases``):
    answers up to :data:`SHORT` tokens, longer ones, or all; and their figures."""
    rows = [c for c in truth["cases"] if c["kind"] == kind
            and (short is None or (c["answer_tokens"] <= SHORT) == short)]
    n = sum(c["answer_tokens"] for c in rows)
    return MeasuredGroup(tuple(Case(tuple(c["prompt_pieces"]), c["answer_tokens"]) for c in rows),
                    SpecFigures(sum(c["drafts"] for c in rows) / n,
                                sum(c["accepted"] for c in rows) / n))


def fitted(truth: Mapping[str, Any]) -> dict[str, float]:
    """The fleet file's ``simulator:`` knobs fitted to ``truth``."""
    free = [measured(truth, "chat", short=True), measured(truth, "chat", short=False)]
    style = fit_style(free, measured(truth, "copy"))
    return {"copy_slip": style.slip, "repeat_share": style.repeat_share,
            "repeat_run_tokens": style.repeat_run, "repeat_after_tokens": style.repeat_after}
