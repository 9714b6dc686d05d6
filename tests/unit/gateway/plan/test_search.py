"""gateway.plan.search: the stages, the race and the moves, on a landscape of known optimum
(replays replaced by a formula: the search's logic alone)."""

from __future__ import annotations

from concurrent.futures import Executor, Future
from typing import Any

from gateway.plan.score import Score
from gateway.plan.search import Problem, Result, Search
from gateway.plan.space import Brief, Candidate, Part, candidate
from gateway.plan.trace import TraceEntry

PER_GPU = {"general": (1.0, 8), "fp8-kv": (1.5, 3), "spec-ngram-2": (1.2, 5)}
"""recipe → (goodput per GPU, GPUs past which more add nothing); any other: (0.5, 8)."""


def goodput(c: Candidate) -> float:
    total = 0.0
    for p in c.parts:
        rate, cap = PER_GPU.get(p.recipe, (0.5, 8))
        total += rate * min(p.gpus, cap)
    return total


def _score(value: float, gpus: int) -> Score:
    return Score(gpus, 100, 100, 100, 10.0, value, 0.1, 0.2, 0.01, 0.02, 0.5, 0.1, 0.5, 1.0, ())


def landscape(problem: Problem, c: Candidate, share: float) -> Result:
    return Result(c, share, _score(goodput(c), c.gpus), 0.0)


class Inline(Executor):
    """Runs each job at submission (the search must not depend on finishing order)."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Candidate, float]] = []

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(fn(*args, **kwargs))
        self.jobs.append((args[1], args[2]))
        return future


def _problem(requests: int, recipes: tuple[str, ...]) -> Problem:
    entries = tuple(TraceEntry(float(i), 100, 10, ()) for i in range(requests))
    return Problem(entries, Brief("llama-3-8b", "nvidia-l4"), gpus=8, recipes=recipes)


RECIPES = ("general", "fp8-kv", "spec-ngram-2", "chunk-512", "pd")


def test_the_search_finds_the_mix_no_uniform_fleet_reaches() -> None:
    executor = Inline()
    results = Search(_problem(50, RECIPES), executor, replay=landscape).run()
    best = results[0]
    assert best.candidate == candidate(Part("fp8-kv", 3), Part("spec-ngram-2", 5))
    assert best.score.goodput == 10.5
    uniform_best = max(goodput(c) for c, _ in executor.jobs if len(c.parts) == 1)
    assert uniform_best == 8.0  # general×8: the plan leads the best uniform fleet by 31 %
    assert all(share == 1.0 for _, share in executor.jobs)  # a short trace is not raced
    assert len(executor.jobs) == len(set(executor.jobs))  # nothing replayed twice
    assert [r.score.goodput for r in results] == sorted(
        (r.score.goodput for r in results), reverse=True)


def test_a_long_trace_is_raced_by_successive_halving() -> None:
    executor = Inline()
    search = Search(_problem(1000, RECIPES), executor, replay=landscape, rounds=0)
    search.run()
    uniform = [(c, s) for c, s in executor.jobs if len(c.parts) == 1]
    counts = {share: sum(1 for _, s in uniform if s == share) for share in (0.25, 0.5, 1.0)}
    assert counts == {0.25: 7, 0.5: 4, 1.0: 2}  # 5 recipes, the pair in 3 splits
    finalists = {c for c, s in uniform if s == 1.0}
    assert finalists == {candidate(Part("general", 8)), candidate(Part("spec-ngram-2", 8))}


def _capacity(c: Candidate) -> float:
    return sum(p.gpus * (4 / 3 if p.recipe == "fp8-kv" else 1.0) for p in c.parts)


def tied(problem: Problem, c: Candidate, share: float) -> Result:
    """Every fleet of capacity 4 or more serves all 100 requests well (a tie on 4 GPUs);
    general×4 has the lowest p99 TTFT, then fp8-kv×4, then the mixes; fp8-kv holds on 3 GPUs,
    general on 4."""
    good = 100 if _capacity(c) >= 4 else 50
    fp8 = any(p.recipe == "fp8-kv" for p in c.parts)
    ttft_p99 = 0.2 + 0.01 * fp8 + 0.05 * (len(c.parts) - 1)
    s = Score(c.gpus, 100, 100, good, 10.0, good / 10, 0.1, ttft_p99, 0.01, 0.02,
              0.5, 0.1, 0.5, 1.0, ())
    return Result(c, share, s, 0.0)


def test_a_tie_goes_to_the_fleet_that_holds_the_slo_on_the_fewest_gpus() -> None:
    executor = Inline()
    problem = Problem(tuple(TraceEntry(float(i), 100, 10, ()) for i in range(50)),
                      Brief("llama-3-8b", "nvidia-l4"), gpus=4, recipes=("general", "fp8-kv"))
    search = Search(problem, executor, replay=tied, rounds=0)
    results = search.run()
    assert results[0].candidate == candidate(Part("fp8-kv", 4))
    assert search.fewest[candidate(Part("fp8-kv", 4))] == 3
    assert search.fewest[candidate(Part("general", 4))] == 4  # lowest p99 TTFT, less headroom
    assert all(r.score.good == 100 for r in results[:2])
    assert (candidate(Part("fp8-kv", 4)), 3) in search.headroom
    assert not any(c.gpus != 4 for c in (r.candidate for r in results))  # shrunk ones aside


def test_no_tie_no_headroom_stage() -> None:
    search = Search(_problem(50, RECIPES), Inline(), replay=landscape, rounds=0)
    search.run()
    assert search.fewest == {} and search.headroom == {}
