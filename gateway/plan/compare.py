"""The plan against the fleets it should beat, on fewer and more GPUs and at heavier load.

:func:`contenders` names, on ``g`` GPUs: the plan (its pools in the same proportions,
:func:`~gateway.plan.space.scaled`), the best uniform fleet the search found (one lever set for
every GPU, what a search over one engine configuration finds), every GPU in one general
prefix-caching pool, and that pool with its replicas picked round robin (a router that ignores
load and cache). :func:`sweep` replays each of them at each GPU count and load scale;
:func:`fewest_gpus` reads off the fewest GPUs on which each holds the SLO, meaning at least
``attainment`` of its requests are good. docs/planning.md#comparing-a-plan.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace

from gateway.plan.search import Problem, Replay, Result, run_candidate
from gateway.plan.space import GENERAL, ROUND_ROBIN, Candidate, Part, candidate, scaled

PLAN = "plan"
UNIFORM = "best uniform"
ONE_POOL = "one general pool"
ROUND_ROBIN_POOL = "one general pool, round robin"
CONTENDERS = (PLAN, UNIFORM, ONE_POOL, ROUND_ROBIN_POOL)


@dataclass(frozen=True, slots=True)
class Point:
    """One contender replayed on ``gpus`` GPUs with arrivals ``scale`` times as dense."""

    contender: str
    gpus: int
    scale: float
    result: Result


def contenders(plan: Candidate, uniform: Candidate, gpus: int) -> dict[str, Candidate]:
    """The fleets the plan is compared with on ``gpus`` GPUs (those that fit on them)."""
    general = candidate(Part(GENERAL, gpus))
    found = {PLAN: scaled(plan, gpus), UNIFORM: scaled(uniform, gpus), ONE_POOL: general,
             ROUND_ROBIN_POOL: replace(general, picker=ROUND_ROBIN)}
    return {name: c for name, c in found.items() if c is not None}


def sweep(problem: Problem, executor: Executor, plan: Candidate, uniform: Candidate,
          gpu_counts: Iterable[int], scales: Iterable[float],
          replay: Replay = run_candidate) -> list[Point]:
    """Every contender at every GPU count and scale, replayed on the whole trace."""
    jobs = []
    for scale in scales:
        scaled_problem = replace(problem, scale=problem.scale * scale)
        for g in gpu_counts:
            for name, c in contenders(plan, uniform, g).items():
                jobs.append((name, g, scale,
                             executor.submit(replay, replace(scaled_problem, gpus=g), c, 1.0)))
    return [Point(name, g, scale, f.result()) for name, g, scale, f in jobs]


def fewest_gpus(points: Sequence[Point], attainment: float) -> dict[tuple[str, float], int | None]:
    """Per (contender, scale): the fewest GPUs on which at least ``attainment`` of the requests
    were good (None: on none of those tried)."""
    best: dict[tuple[str, float], int | None] = {}
    for p in points:
        key = (p.contender, p.scale)
        best.setdefault(key, None)
        if p.result.score.holds(attainment):
            current = best[key]
            best[key] = p.gpus if current is None else min(current, p.gpus)
    return best


def gpus_table(points: Sequence[Point], attainment: float) -> str:
    """The fewest GPUs holding the SLO, a row per contender, a column per scale."""
    fewest = fewest_gpus(points, attainment)
    scales = sorted({p.scale for p in points})
    tried = sorted({p.gpus for p in points})
    head = ["fleet", *(f"x{s:g} load" for s in scales)]
    rows = [head]
    for name in CONTENDERS:
        if any(p.contender == name for p in points):
            rows.append([name, *(_gpus(fewest.get((name, s)), tried) for s in scales)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return (f"fewest GPUs on which {attainment:.0%} of requests meet the SLO "
            f"(tried {', '.join(map(str, tried))}):\n" + "\n".join(lines))


def sweep_table(points: Sequence[Point]) -> str:
    """Every point of the sweep: goodput per GPU [good req/s] and the share of good requests,
    a row per contender and load, a column per GPU count."""
    tried = sorted({p.gpus for p in points})
    at = {(p.contender, p.scale, p.gpus): p.result.score for p in points}
    rows = [["fleet", "load", *(f"{g} GPUs" for g in tried)]]
    for scale in sorted({p.scale for p in points}):
        for name in CONTENDERS:
            cells = [f"{s.goodput_per_gpu:.3f} ({s.good_share:.0%})"
                     if (s := at.get((name, scale, g))) is not None else "-" for g in tried]
            if any(c != "-" for c in cells):
                rows.append([name, f"x{scale:g}", *cells])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "goodput per GPU [good req/s] (share of requests good):\n" + "\n".join(lines)


def _gpus(n: int | None, tried: Sequence[int]) -> str:
    return f"> {max(tried)}" if n is None else str(n)


def side_by_side(points: Sequence[Point], gpus: int, scale: float = 1.0) -> Mapping[str, Result]:
    """Each contender's result on ``gpus`` GPUs at ``scale``."""
    return {p.contender: p.result for p in points
            if p.gpus == gpus and math.isclose(p.scale, scale)}
