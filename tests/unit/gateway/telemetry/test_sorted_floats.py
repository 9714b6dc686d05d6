from __future__ import annotations

import bisect
import math
import random

from gateway.telemetry.sorted_floats import bisect_left, bisect_right


def test_both_searches_give_bisects_answers_for_every_kind_of_float() -> None:
    rng = random.Random(7)
    specials = [0.0, -0.0, 1.0, math.inf, -math.inf, math.nan, 5e-324]
    for _ in range(2_000):
        values = sorted(rng.choice([rng.uniform(-3, 3), float(rng.randint(-3, 3)), math.inf,
                                    -math.inf]) for _ in range(rng.randint(0, 12)))
        probes = [*specials, *values, *(rng.uniform(-4, 4) for _ in range(4))]
        for x in probes:
            assert bisect_left(values, x) == bisect.bisect_left(values, x), (values, x)
            assert bisect_right(values, x) == bisect.bisect_right(values, x), (values, x)


def test_equal_values_go_before_or_after_their_run() -> None:
    values = [0.1, 0.5, 0.5, 0.5, 2.0]
    assert (bisect_left(values, 0.5), bisect_right(values, 0.5)) == (1, 4)
    assert (bisect_left(values, math.nan), bisect_right(values, math.nan)) == (0, 5)
    assert bisect_left([], 1.0) == bisect_right([], 1.0) == 0
