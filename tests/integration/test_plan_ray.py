"""The planner's replays on a real Ray cluster (:class:`gateway.plan.executors.RayExecutor`):
a one-machine Ray instance gives the same plan, replay for replay, as local processes.

Opt-in (``TEST_ON_RAY=1``, with ``pip install 'ridge[ray]'``): Ray 2.60's GCS server and
agents listen on every interface even when the node's address is 127.0.0.1, and the suite's
servers bind 127.0.0.1 only. The adapter itself is unit-tested against a fake Ray
(tests/unit/gateway/plan/test_executors.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.plan.executors import LOCAL, RayExecutor, local_executor
from gateway.plan.search import Problem, Search
from gateway.plan.space import Brief
from gateway.plan.trace import load_trace

pytestmark = pytest.mark.skipif(not os.environ.get("TEST_ON_RAY"),
                                reason="opt-in: TEST_ON_RAY=1 (Ray listens on every interface)")

TRACE = Path(__file__).resolve().parents[2] / "bench" / "ridge_bench" / "traces" / \
    "conversations.jsonl"


def test_a_plan_on_ray_is_the_plan_on_local_processes() -> None:
    pytest.importorskip("ray")
    problem = Problem(tuple(load_trace(TRACE)[:12]), Brief("llama-3-8b", "nvidia-l4", ttft_s=1.0),
                      gpus=2, settings={"auth": "off", "log_level": "warning"},
                      recipes=("general", "chunk-512"))
    with RayExecutor(LOCAL) as ray:
        on_ray = Search(problem, ray, rounds=1).run()
    with local_executor(1) as local:
        here = Search(problem, local, rounds=1).run()
    assert [(r.candidate, r.score) for r in on_ray] == [(r.candidate, r.score) for r in here]
    assert len(on_ray) >= 3  # two uniform fleets and a mix at least
