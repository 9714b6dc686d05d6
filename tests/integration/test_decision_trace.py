"""The router's decisions on seeded workloads are pinned: every cell of
:mod:`tests.integration.decision_replay` (fleet × workload) must route exactly as recorded in
``tests/data/decision_trace.json``. A deliberate change of routing behaviour re-records it
(``python -m tests.integration.decision_replay``) and says why in its commit.

Admission control changes no decision either: in these replays no engine ever queues, so no
endpoint's capacity is known (the replay's engines report no KV usage) and none is full."""

from __future__ import annotations

import json

import pytest

from tests.integration.decision_replay import FLEETS, GOLDEN, WORKLOADS, digest, trace

RECORDED = json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("fleet", list(FLEETS))
@pytest.mark.parametrize("workload", WORKLOADS)
def test_decisions_match_the_recorded_trace(fleet: str, workload: str) -> None:
    lines = trace(fleet, workload)
    cell = RECORDED[f"{fleet}/{workload}"]
    assert len(lines) == cell["requests"]
    assert digest(lines) == cell["digest"]


@pytest.mark.parametrize("fleet", list(FLEETS))
@pytest.mark.parametrize("workload", WORKLOADS)
def test_admission_control_changes_no_decision(fleet: str, workload: str) -> None:
    lines = trace(fleet, workload, admission=True)
    assert digest(lines) == RECORDED[f"{fleet}/{workload}"]["digest"]
