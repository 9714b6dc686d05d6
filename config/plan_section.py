"""The fleet file's ``plan:`` section: what ``ridge plan`` predicted for each pool.

``ridge plan`` writes it into the fleet file it plans (:mod:`gateway.plan.report`); the
gateway compares it with what it measures and exports the drift, so an operator knows when to
plan again (``ridge_plan_share_drift``, ``ridge_plan_wall_matches``, docs/telemetry.md).
Per pool: ``share``, the fraction of the answered requests the pool was predicted to answer
(the shares of a plan add up to 1; a decode pool is left out, its requests counted under its
prefill pool's name as the gateway counts them), and ``wall``, the binding wall predicted for
it (:data:`routing.binding_wall.WALLS`).
``source`` says which trace it was planned from. Every pool named must be a pool of the fleet
(:mod:`config.fleet`). See docs/planning.md#when-to-plan-again.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from config.strict import Strict

Wall = Literal["kv_capacity", "compute", "memory_bandwidth", "prefill_decode_contention",
               "none", "-"]
"""A binding wall's name (:data:`routing.binding_wall.WALLS`), or ``-``: the pool had no
traffic when the planner read the walls."""


class PlannedPool(Strict):
    """One pool's prediction: its share of the answered requests and its binding wall."""

    share: Annotated[float, Field(ge=0, le=1)]
    wall: Wall = "-"


class PlanSection(Strict):
    """What ``ridge plan`` predicted (module docstring)."""

    source: str = Field(default="", description="the trace it was planned from")
    pools: dict[str, PlannedPool] = Field(default_factory=dict)
