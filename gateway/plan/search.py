"""The search: which candidate fleets to replay, on how much of the trace, in which processes.

Three stages, each a race by successive halving (every candidate on the first quarter of the
trace, the better half on the first half, the better half of those on all of it; a trace
shorter than :data:`RACE_MIN_REQUESTS` goes whole at once):

1. **uniform**: every recipe on all the GPUs (a pair: three prefill/decode splits) — the best
   of these is also the "best uniform fleet" a plan is compared with;
2. **mixes**: two pools, from the :data:`TOP_RECIPES` best recipes of stage 1 (and the pair
   when it raced), at a quarter, half and three quarters of the GPUs;
3. **moves**: from the best fleet so far, one GPU moved between its pools, one pool's recipe
   swapped for a top recipe, or one policy threshold moved a step
   (:data:`~gateway.plan.space.POLICY_STEPS`), repeated while a move wins, at most
   ``rounds`` times;
4. **headroom**: when the best fleets tie (they hold the SLO, with objectives within
   :data:`TIE` of each other: every request good, say), the :data:`HEADROOM_LEADERS` best are
   replayed in the same proportions on one GPU fewer, then two, while more than one of them
   holds; the tie goes to the one that holds on the fewest, the fleet with the most headroom.

Candidates run in parallel through any :class:`concurrent.futures.Executor`: local processes
or a Ray cluster (:mod:`gateway.plan.executors`). Each evaluation is independent and
deterministic for its seed, so the order they finish in changes nothing.
docs/planning.md#the-search.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, as_completed
from dataclasses import dataclass, field, replace
from typing import Any

from config.fleet import parse_fleet
from config.routing_section import PolicySettings
from gateway.plan.evaluate import evaluate
from gateway.plan.score import Score, score
from gateway.plan.space import (
    BY_NAME,
    POLICY_STEPS,
    RECIPES,
    Brief,
    Candidate,
    Part,
    candidate,
    fleet_document,
    policy_matters,
    scaled,
    uniform,
)
from gateway.plan.trace import TraceEntry
from gateway.settings import Settings
from routing.formulas import Bounds

RACE_MIN_REQUESTS = 400
"""A trace with fewer requests is not cut into rungs: every candidate replays all of it."""
RUNGS = (0.25, 0.5, 1.0)
"""The shares of the trace the race's rungs replay."""
TOP_RECIPES = 3
"""How many of stage 1's recipes the mixes combine."""
TIE = 0.01
"""Objectives within this fraction of the best's tie (stage 4)."""
HEADROOM_LEADERS = 4
"""How many tied leaders stage 4 replays on fewer GPUs."""


@dataclass(frozen=True, slots=True)
class Problem:
    """What to plan for: the trace, the brief (model, accelerator, engine, SLO), the
    GPUs, the load scale, the seed, the gateway's settings (as ``Settings`` keywords), the
    price of a GPU-hour and the objective (:data:`gateway.plan.score.OBJECTIVES`)."""

    entries: tuple[TraceEntry, ...]
    brief: Brief
    gpus: int
    scale: float = 1.0
    seed: int = 0
    settings: dict[str, Any] = field(default_factory=dict)
    price_per_gpu_hour: float = 2.0
    objective: str = "goodput"
    recipes: tuple[str, ...] = tuple(r.name for r in RECIPES)
    attainment: float = 0.99
    """A fleet holds the SLO when at least this share of its requests is good."""

    @property
    def bounds(self) -> Bounds:
        return Bounds(self.brief.ttft_s, self.brief.tpot_s)


@dataclass(frozen=True, slots=True)
class Result:
    """A candidate replayed on ``share`` of the trace: its score and the CPU it took [s]."""

    candidate: Candidate
    share: float
    score: Score
    cpu_s: float


def run_candidate(problem: Problem, c: Candidate, share: float) -> Result:
    """Replay ``c`` on the first ``share`` of the trace (a worker process's job)."""
    started = time.process_time()
    fleet = parse_fleet(fleet_document(c, problem.brief))
    entries = problem.entries[:max(1, math.ceil(share * len(problem.entries)))]
    ev = evaluate(fleet, entries, settings=Settings(**problem.settings), seed=problem.seed,
                  scale=problem.scale)
    return Result(c, share, score(ev, fleet, problem.bounds, problem.price_per_gpu_hour),
                  time.process_time() - started)


Progress = Callable[[str, int, int, Result], None]
"""Told of each finished evaluation: the stage, how many of its evaluations are done, how many
it has, the result."""
Replay = Callable[[Problem, Candidate, float], Result]
"""Replays a candidate on a share of the trace (:func:`run_candidate`; a module-level function,
so that worker processes can run it)."""


class Search:
    """One plan's search (module docstring) over ``executor``, ``rounds`` rounds of moves at
    most; ``replay`` runs each evaluation."""

    def __init__(self, problem: Problem, executor: Executor,
                 progress: Progress | None = None, rounds: int = 3,
                 replay: Replay = run_candidate) -> None:
        self.problem = problem
        self._executor = executor
        self._progress = progress
        self._rounds = rounds
        self._replay = replay
        self.results: dict[tuple[Candidate, float], Result] = {}
        self.headroom: dict[tuple[Candidate, int], Result] = {}
        """Stage 4: a leader (the key's candidate) replayed in proportion on fewer GPUs."""
        self.fewest: dict[Candidate, int] = {}
        """Stage 4: per tied leader, the fewest GPUs it was seen to hold the SLO on."""
        self.evaluations = 0

    def run(self) -> list[Result]:
        """Every candidate replayed on the whole trace, best first."""
        p = self.problem
        recipes = [BY_NAME[name] for name in p.recipes]
        stage1 = [c for r in recipes for c in uniform(r, p.gpus)]
        self._race("uniform", stage1)
        top = self._top_recipes()
        self._race("mixes", list(self._mixes(top)))
        best = self.ranked()[0]
        for round_ in range(self._rounds):
            moves = [c for c in self._moves(best.candidate, top)
                     if (c, 1.0) not in self.results]
            if not moves:
                break
            self._race(f"moves {round_ + 1}", moves)
            new = self.ranked()[0]
            if new.candidate == best.candidate:
                break
            best = new
        self._headroom()
        return self.ranked()

    def ranked(self, share: float = 1.0) -> list[Result]:
        """The results on ``share`` of the trace, best first (:meth:`_key`)."""
        found = [r for (_, s), r in self.results.items() if s == share]
        return sorted(found, key=self._key)

    def _key(self, r: Result) -> tuple[int, float, float, float, float, str]:
        """Best first: the tied leaders of stage 4 by the fewest GPUs they hold on, then
        everything by the objective; at a tie, the lower p99 TTFT, then the lower p99 TPOT,
        then the label."""
        s = r.score
        fewest = self.fewest.get(r.candidate)
        return (0 if fewest is not None else 1, fewest or 0,
                -s.objective(self.problem.objective, self.problem.price_per_gpu_hour),
                _or_inf(s.ttft_p99), _or_inf(s.tpot_p99), r.candidate.label)

    def _holds(self, r: Result) -> bool:
        return r.score.holds(self.problem.attainment)

    def _tied(self) -> list[Candidate]:
        """The best fleets on the whole trace that hold the SLO and tie on the objective, in
        rank order; of those whose replays came out alike, the first."""
        p = self.problem
        ranked = self.ranked()
        if not ranked or not self._holds(ranked[0]):
            return []
        top = ranked[0].score.objective(p.objective, p.price_per_gpu_hour)
        leaders: dict[Score, Candidate] = {}  # one of those that replayed alike (a threshold
        for r in ranked:                       # the trace never reaches)
            gap = abs(r.score.objective(p.objective, p.price_per_gpu_hour) - top)
            if len(leaders) == HEADROOM_LEADERS or gap > TIE * abs(top):
                break
            if self._holds(r):
                leaders.setdefault(r.score, r.candidate)
        return list(leaders.values())

    def _headroom(self) -> None:
        """Stage 4 (module docstring)."""
        leaders = self._tied()
        if len(leaders) < 2:
            return
        self.fewest = dict.fromkeys(leaders, self.problem.gpus)
        gpus = self.problem.gpus - 1
        while len(leaders) > 1 and gpus >= 1:
            smaller = {c: s for c in leaders if (s := scaled(c, gpus)) is not None}
            problem = replace(self.problem, gpus=gpus)
            futures = {s: self._executor.submit(self._replay, problem, s, 1.0)
                       for s in dict.fromkeys(smaller.values())}  # leaders may shrink alike
            for n, future in enumerate(futures.values(), 1):
                result = future.result()
                self.evaluations += 1
                if self._progress is not None:
                    self._progress(f"headroom {gpus} GPUs", n, len(futures), result)
            holding = []
            for c, s in smaller.items():
                result = self.headroom[(c, gpus)] = futures[s].result()
                if self._holds(result):
                    holding.append(c)
                    self.fewest[c] = gpus
            leaders = holding
            gpus -= 1

    def _race(self, stage: str, pool: Sequence[Candidate]) -> None:
        rungs = RUNGS if len(self.problem.entries) >= RACE_MIN_REQUESTS else (1.0,)
        alive = list(dict.fromkeys(pool))
        for i, share in enumerate(rungs):
            done = self._evaluate(stage, alive, share)
            if i + 1 < len(rungs):
                done.sort(key=self._key)
                alive = [r.candidate for r in done[:max(2, math.ceil(len(done) / 2))]]

    def _evaluate(self, stage: str, pool: Iterable[Candidate], share: float) -> list[Result]:
        todo = [c for c in pool if (c, share) not in self.results]
        futures = [self._executor.submit(self._replay, self.problem, c, share) for c in todo]
        for n, future in enumerate(as_completed(futures), 1):
            result = future.result()
            self.results[(result.candidate, share)] = result
            self.evaluations += 1
            if self._progress is not None:
                self._progress(stage, n, len(futures), result)
        return [self.results[(c, share)] for c in dict.fromkeys(pool)]

    def _top_recipes(self) -> list[str]:
        """Stage 1's best recipes, by their best result on the largest share they reached."""
        best: dict[str, tuple[float, tuple[int, float, float, float, float, str]]] = {}
        for (c, share), r in self.results.items():
            name = c.parts[0].recipe
            key = (-share, self._key(r))
            if name not in best or key < best[name]:
                best[name] = key
        return sorted(best, key=lambda n: best[n])[:TOP_RECIPES]

    def _mixes(self, top: Sequence[str]) -> Iterable[Candidate]:
        gpus = self.problem.gpus
        for i, a in enumerate(top):
            for b in top[i + 1:]:
                for n in sorted({gpus // 4, gpus // 2, 3 * gpus // 4}):
                    if 1 <= n < gpus:
                        yield from _pair_of(a, n, b, gpus - n)

    def _moves(self, c: Candidate, top: Sequence[str]) -> Iterable[Candidate]:
        parts = list(c.parts)
        for i in range(len(parts)):  # one GPU from part i to part j
            for j in range(len(parts)):
                if i != j:
                    yield from _moved(c, i, j)
        names = {p.recipe for p in parts}
        for i, a in enumerate(parts):  # one GPU from part i to a new pool of a top recipe
            for name in top:
                if name not in names and not BY_NAME[name].pair and a.gpus > 1:
                    for take in _taken(a):
                        rest = [p for k, p in enumerate(parts) if k != i]
                        yield candidate(*rest, take, Part(name, 1), policy=dict(c.policy))
        for i, a in enumerate(parts):  # one pool's recipe swapped
            for name in top:
                if name not in names and BY_NAME[name].pair == BY_NAME[a.recipe].pair:
                    rest = [p for k, p in enumerate(parts) if k != i]
                    yield candidate(*rest, Part(name, a.replicas, a.decode),
                                    policy=dict(c.policy))
        for name, steps in POLICY_STEPS.items():  # one threshold a step
            if not policy_matters(c, name):
                continue
            current = dict(c.policy).get(name)
            for value in _neighbours(steps, current, name):
                yield c.with_policy(name, value)


def _pair_of(a: str, n: int, b: str, m: int) -> Iterable[Candidate]:
    """Pools ``a`` on ``n`` GPUs and ``b`` on ``m``; a pair splits its GPUs in half."""
    parts = []
    for name, gpus in ((a, n), (b, m)):
        if BY_NAME[name].pair:
            if gpus < 2:
                return
            parts.append(Part(name, gpus // 2, gpus - gpus // 2))
        else:
            parts.append(Part(name, gpus))
    yield candidate(*parts)


def _moved(c: Candidate, i: int, j: int) -> Iterable[Candidate]:
    """``c`` with one GPU taken from part ``i`` (its decode side first when both sides could
    spare one, then the other) and given to part ``j``."""
    parts = list(c.parts)
    src, dst = parts[i], parts[j]
    takes = _taken(src)
    if BY_NAME[dst.recipe].pair:
        gives = [Part(dst.recipe, dst.replicas + 1, dst.decode),
                 Part(dst.recipe, dst.replicas, dst.decode + 1)]
    else:
        gives = [Part(dst.recipe, dst.replicas + 1)]
    rest = [p for k, p in enumerate(parts) if k not in (i, j)]
    for take in takes:
        for give in gives:
            yield candidate(*rest, take, give, policy=dict(c.policy))


def _taken(p: Part) -> list[Part]:
    """``p`` less one GPU, every way it can spare one (a pair's decode side first)."""
    takes = []
    if p.decode > 1:
        takes.append(Part(p.recipe, p.replicas, p.decode - 1))
    if p.replicas > 1:
        takes.append(Part(p.recipe, p.replicas - 1, p.decode))
    return takes


def _or_inf(value: float) -> float:
    return math.inf if math.isnan(value) else value


def _neighbours(steps: Sequence[float], current: float | None, name: str) -> list[float]:
    """The values next to ``current`` on ``steps`` (unset: next to the policy's default)."""
    value = current if current is not None else float(getattr(PolicySettings(), name))
    nearest = min(range(len(steps)), key=lambda k: abs(steps[k] - value))
    return [steps[k] for k in (nearest - 1, nearest, nearest + 1)
            if 0 <= k < len(steps) and steps[k] != value]
