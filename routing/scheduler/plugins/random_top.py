"""Picker ``random_top``: a random endpoint among those with the highest total score.

Algorithm: the candidates whose total equals the maximum (up to float rounding), one drawn
uniformly with a :class:`random.Random` seeded once per scheduler, so a run is reproducible
and ties spread over the tied endpoints instead of always hitting the first. The generator is
this plugin instance's state; each scheduler builds its own instance.

Parameters: ``seed`` (int), from the scheduler configuration.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from routing.scheduler.framework import SchedulingContext, top
from routing.snapshots import EndpointSnapshot


class RandomTop:
    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def pick(self, ctx: SchedulingContext, candidates: Sequence[EndpointSnapshot],
             totals: list[float]) -> EndpointSnapshot:
        return self._rng.choice(top(candidates, totals))
