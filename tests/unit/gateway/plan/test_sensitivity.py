"""gateway.plan.sensitivity: the top candidates on slower engines (replays replaced by a
formula), and the slower engines' fleet files."""

from __future__ import annotations

import pytest

from config.fleet import parse_fleet
from gateway.plan.score import Score
from gateway.plan.search import Problem, Result
from gateway.plan.sensitivity import sensitivity, verdicts
from gateway.plan.space import Brief, Candidate, Part, candidate, fleet_document
from tests.unit.gateway.plan.test_search import Inline

SPEC = candidate(Part("spec-ngram-4", 4))
FP8 = candidate(Part("fp8-kv", 4))


def replay(problem: Problem, c: Candidate, share: float) -> Result:
    """Speculation wins on the datasheet's bandwidth, loses when decode is 2x slower."""
    slow = problem.brief.bandwidth_scale < 1
    value = {SPEC: 1.0 if slow else 3.0, FP8: 2.0}[c]
    return Result(c, share, Score(4, 10, 10, 10, 1.0, value, 0.1, 0.2, 0.01, 0.02, 0.5, 0.1,
                                  0.5, 1.0, ()), 0.0)


def test_a_plan_that_only_wins_on_fast_engines_is_said_to() -> None:
    problem = Problem((), Brief("llama-3-8b", "nvidia-l4"), gpus=4)
    top = [replay(problem, SPEC, 1.0), replay(problem, FP8, 1.0)]
    lines = verdicts(top[0], sensitivity(problem, Inline(), top, replay=replay))
    assert lines[0].startswith("decode 2x slower") and "fp8-kv×4 becomes the best" in lines[0]
    assert lines[1].startswith("prefill 2x slower") and "still the best of 2" in lines[1]


def test_slower_engines_are_the_datasheets_rates_scaled() -> None:
    brief = Brief("llama-3-8b", "nvidia-l4", flops_scale=0.5, bandwidth_scale=0.25)
    hardware = parse_fleet(fleet_document(FP8, brief)).pools[0].hardware
    assert hardware is not None
    assert hardware.peak_flops == pytest.approx(121e12 * 0.5)
    assert hardware.mem_bandwidth == pytest.approx(300e9 * 0.25)
    assert hardware.name == "nvidia-l4"


def test_when_no_candidate_meets_the_slo_the_verdict_says_so() -> None:
    def nothing_good(problem: Problem, c: Candidate, share: float) -> Result:
        return Result(c, share, Score(4, 10, 10, 0, 1.0, 0.0, 0.1, 0.2, 0.01, 0.02, 0.5, 0.1,
                                      0.5, float("inf"), ()), 0.0)

    problem = Problem((), Brief("llama-3-8b", "nvidia-l4"), gpus=4)
    top = [nothing_good(problem, FP8, 1.0), nothing_good(problem, SPEC, 1.0)]
    lines = verdicts(top[0], sensitivity(problem, Inline(), top, replay=nothing_good))
    assert all("none of the 2 serves a request within the SLO" in line for line in lines)
