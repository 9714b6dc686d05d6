"""gateway.plan.compare: the contenders, the sweep and the fewest GPUs holding the SLO (replays
replaced by a formula); gateway.plan.plots writes real PNGs of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.plan.compare import (
    ONE_POOL,
    PLAN,
    ROUND_ROBIN_POOL,
    UNIFORM,
    contenders,
    fewest_gpus,
    gpus_table,
    sweep,
    sweep_table,
)
from gateway.plan.plots import cost_against_ttft, goodput_against_gpus
from gateway.plan.score import Score
from gateway.plan.search import Problem, Result
from gateway.plan.space import ROUND_ROBIN, Brief, Candidate, Part, candidate
from tests.unit.gateway.plan.test_search import Inline

PLANNED = candidate(Part("fp8-kv", 2), Part("chunk-512", 2))
UNIFORM_BEST = candidate(Part("fp8-kv", 4))


def _capacity(c: Candidate) -> float:
    """Requests a fleet holds per second: a GPU of the plan 1.0, of fp8 alone 0.8, else 0.5;
    round robin loses a fifth."""
    per = 1.0 if len(c.parts) == 2 else 0.8 if c.parts[0].recipe == "fp8-kv" else 0.5
    return c.gpus * per * (0.8 if c.picker == ROUND_ROBIN else 1.0)


def replay(problem: Problem, c: Candidate, share: float) -> Result:
    offered = 2.0 * problem.scale
    good = min(1.0, _capacity(c) / offered)
    score = Score(c.gpus, 100, 100, int(good * 100), 10.0, offered * good, 0.1, 0.2 + 1 / c.gpus,
                  0.01, 0.02, 0.5, 0.1, 0.5, 10.0 / c.gpus, ())
    return Result(c, share, score, 0.0)


def test_the_contenders_on_g_gpus() -> None:
    found = contenders(PLANNED, UNIFORM_BEST, 2)
    assert found[PLAN] == candidate(Part("fp8-kv", 1), Part("chunk-512", 1))
    assert found[UNIFORM] == candidate(Part("fp8-kv", 2))
    assert found[ONE_POOL] == candidate(Part("general", 2))
    assert found[ROUND_ROBIN_POOL].picker == ROUND_ROBIN
    assert PLAN not in contenders(PLANNED, UNIFORM_BEST, 1)  # two pools need two GPUs


def test_the_fewest_gpus_holding_the_slo_at_each_load() -> None:
    problem = Problem((), Brief("llama-3-8b", "nvidia-l4"), gpus=4)
    points = sweep(problem, Inline(), PLANNED, UNIFORM_BEST, (1, 2, 3, 4), (1.0, 2.0),
                   replay=replay)
    fewest = fewest_gpus(points, attainment=0.99)
    assert fewest[(PLAN, 1.0)] == 2 and fewest[(PLAN, 2.0)] == 4
    assert fewest[(UNIFORM, 1.0)] == 3 and fewest[(UNIFORM, 2.0)] is None
    assert fewest[(ONE_POOL, 1.0)] == 4 and fewest[(ROUND_ROBIN_POOL, 1.0)] is None
    table = gpus_table(points, 0.99)
    assert "plan " in table and "> 4" in table and "x2 load" in table
    rows = sweep_table(points).splitlines()
    assert rows[1].split() == ["fleet", "load", "1", "GPUs", "2", "GPUs", "3", "GPUs", "4",
                               "GPUs"]
    plan_x1 = next(r for r in rows if r.startswith("plan ") and " x1 " in r)
    assert plan_x1.split()[2:] == ["-", "1.000", "(100%)", "0.667", "(100%)", "0.500",
                                   "(100%)"]  # one GPU holds no two pools


def test_the_plots_are_pngs(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    problem = Problem((), Brief("llama-3-8b", "nvidia-l4"), gpus=4)
    points = sweep(problem, Inline(), PLANNED, UNIFORM_BEST, (2, 4), (1.0,), replay=replay)
    results = [p.result for p in points]
    for path in (cost_against_ttft(results, tmp_path / "a.png"),
                 goodput_against_gpus(points, tmp_path / "b.png")):
        head = path.read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n"
        width = int.from_bytes(head[16:20], "big")
        assert width > 400
