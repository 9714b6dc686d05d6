"""Binary search in an ascending list of floats, as :mod:`bisect`'s, but compiled.

A histogram's bucket (:mod:`gateway.telemetry.lean_metrics`) and the engine-step count's
intervals (:mod:`gateway.telemetry.engine_steps`) are searched for every token of a stream;
``bisect``'s functions box each float they are given and compare the objects, these compare
machine floats. Same results as ``bisect.bisect_left`` and ``bisect.bisect_right`` for every
float, NaN included: a comparison with NaN is false in both. See docs/telemetry.md#engine-steps.
"""

from __future__ import annotations


def bisect_left(values: list[float], x: float) -> int:
    """The index where ``x`` would go in ``values`` (ascending), before any equal to it."""
    lo, hi = 0, len(values)
    while lo < hi:
        mid = (lo + hi) // 2
        if values[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def bisect_right(values: list[float], x: float) -> int:
    """The index where ``x`` would go in ``values`` (ascending), after any equal to it."""
    lo, hi = 0, len(values)
    while lo < hi:
        mid = (lo + hi) // 2
        if x < values[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo
