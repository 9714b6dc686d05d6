"""Engine steps counted from finished streams, for ridge's MFU/MBU accounting.

Weights are read once per engine step, shared by the batch, so pricing an endpoint's bytes
needs its number of steps, which ridge does not see. Streams decoding at the same time share
steps, so each endpoint keeps the union of the decode intervals it has seen
(:class:`IntervalUnion`), and a newly finished request adds only its steps in time not yet
covered (:class:`StepCounter`): exactly, from its token times, when it streamed; spread evenly
over its interval when it did not. A prefill adds one step unless it shared one with another
prefill or, where prefill mixes into decode steps, fell inside a decode interval.

Parameters (:class:`StepCounter`): ``prefill_shares_decode_steps``, ``tolerance_s``,
``horizon_s``, ``max_intervals``. Times are seconds on the caller's clock; nothing here reads a
clock. See docs/telemetry.md#engine-steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from gateway.telemetry.sorted_floats import bisect_left, bisect_right
from routing.formulas import RequestTokens
from routing.native_value import NativeValue


class IntervalUnion:
    """A sorted set of disjoint [start, end] intervals (seconds), for :class:`StepCounter`.
    ``max_intervals`` bounds memory: the oldest intervals are forgotten first."""

    __slots__ = ("_starts", "_ends", "_max")

    def __init__(self, max_intervals: int = 10_000) -> None:
        self._starts: list[float] = []
        self._ends: list[float] = []
        self._max = max_intervals

    def __len__(self) -> int:
        return len(self._starts)

    def covers(self, t: float, tolerance: float = 0.0) -> bool:
        """Whether instant ``t`` lies inside an interval widened by ``tolerance`` [s] each side."""
        i = bisect_right(self._starts, t + tolerance) - 1
        return i >= 0 and self._ends[i] >= t - tolerance

    def covered(self, times: list[float], tolerance: float = 0.0) -> list[bool]:
        """:meth:`covers` of each of ``times`` (seconds, ascending as a stream's token times
        are): one binary search, then a walk forward over the intervals."""
        starts, ends = self._starts, self._ends
        last, out = len(starts) - 1, []
        i, before = -1, -math.inf
        for t in times:
            reach = t + tolerance
            if t < before:  # out of order: search again
                i = -1
            if i < 0 or (i < last and starts[i + 1] <= reach):
                i = bisect_right(starts, reach) - 1
            out.append(i >= 0 and ends[i] >= t - tolerance)
            before = t
        return out

    def add(self, start: float, end: float) -> list[tuple[float, float]]:
        """Insert [start, end]; returns the parts of it that were not covered before."""
        lo = bisect_left(self._ends, start)
        hi = bisect_right(self._starts, end)
        holes, cursor = [], start
        for i in range(lo, hi):
            if self._starts[i] > cursor:
                holes.append((cursor, self._starts[i]))
            cursor = max(cursor, self._ends[i])
        if cursor < end:
            holes.append((cursor, end))
        if lo < hi:
            start, end = min(start, self._starts[lo]), max(end, self._ends[hi - 1])
        self._starts[lo:hi] = [start]
        self._ends[lo:hi] = [end]
        self._trim()
        return holes

    def forget_before(self, t: float) -> None:
        """Drop intervals that ended before ``t``."""
        cut = bisect_left(self._ends, t)
        del self._starts[:cut], self._ends[:cut]

    def _trim(self) -> None:
        extra = len(self._starts) - self._max
        if extra > 0:
            del self._starts[:extra], self._ends[:extra]


class StepSpan(NativeValue):
    """``steps`` engine steps done evenly over [start, end] (seconds; an instant if equal)."""

    FIELDS = ("start", "end", "steps")
    __slots__ = FIELDS

    def __init__(self, start: float, end: float, steps: float) -> None:
        self.start: Final = start
        self.end: Final = end
        self.steps: Final = steps


@dataclass(frozen=True, slots=True)
class Steps:
    """Engine steps a request added to its endpoint's count: its prefill's (0 or 1, at the
    first token), and its decodes', where in time they happened."""

    prefill: float
    decode: tuple[StepSpan, ...] = ()

    @property
    def decode_total(self) -> float:
        return sum(span.steps for span in self.decode)


class StepCounter:
    """Counts one endpoint's engine steps from its finished streams (see the module docstring).

    Parameters: ``prefill_shares_decode_steps`` (the engine runs a prefill inside the running
    decodes' step, as vLLM does; SGLang runs prefill-only steps); ``tolerance_s``, how close
    two first tokens must be to come from one prefill step (a batch of prefills); ``horizon_s``,
    how long intervals and first-token instants are remembered; ``max_intervals`` bounds both
    (first-token instants to a quarter more, cut in batches: :meth:`_forget`).
    """

    def __init__(self, prefill_shares_decode_steps: bool, *, tolerance_s: float = 0.002,
                 horizon_s: float = 600.0, max_intervals: int = 10_000) -> None:
        self._shares = prefill_shares_decode_steps
        self._tolerance = tolerance_s
        self._horizon = horizon_s
        self._max = max_intervals
        self.decoding = IntervalUnion(max_intervals)
        self._firsts: list[float] = []

    def add(self, first_token_at: float, finished_at: float, tokens: RequestTokens,
            gaps: Sequence[float] = ()) -> Steps:
        """The steps one finished request adds; records its decode interval [first token,
        end] (seconds). ``gaps``: its stream's inter-token gaps [s], when measured."""
        prefill = self.prefill_steps(first_token_at, tokens)
        return Steps(prefill, self.decode_steps(first_token_at, finished_at, tokens, gaps))

    def prefill_steps(self, at: float, tokens: RequestTokens) -> float:
        """1 when the prefill that produced a first token at ``at`` ran a step of its own,
        else 0 (batched with another prefill, or inside running decodes' steps)."""
        if tokens.prompt <= 0 and tokens.completion <= 0:
            return 0.0
        batched = self._near_first(at)
        self._firsts.insert(bisect_right(self._firsts, at), at)
        if batched or (self._shares and self.decoding.covers(at, self._tolerance)):
            return 0.0
        return 1.0

    def _near_first(self, at: float) -> bool:
        i = bisect_left(self._firsts, at - self._tolerance)
        return i < len(self._firsts) and self._firsts[i] <= at + self._tolerance

    def decode_steps(self, first: float, end: float, tokens: RequestTokens,
                     gaps: Sequence[float] = ()) -> tuple[StepSpan, ...]:
        """New decode steps of a stream that decoded over [first, end], as spans of time;
        records the interval. Call after :meth:`prefill_steps` for the same request."""
        self._forget(end - self._horizon)
        if gaps:
            times: list[float] = []
            at = first
            for gap in gaps:  # the token instants: first + the running sum of the gaps
                at += gap
                times.append(at)
            held = self.decoding.covered(times, self._tolerance)
            self.decoding.add(first, max(first, end))
            return _runs(times, held)
        if tokens.decode_steps == 0:
            return ()
        if end <= first:
            return (StepSpan(first, first, float(tokens.decode_steps)),)
        rate = tokens.decode_steps / (end - first)  # steps per second, taken as even
        return tuple(StepSpan(a, b, (b - a) * rate) for a, b in self.decoding.add(first, end)
                     if b > a)

    def _forget(self, before: float) -> None:
        """Forget what ended before ``before``. First-token instants are cut in batches (cutting
        a list's head moves all the rest): those older than ``before`` once a quarter of the
        bound of them, or half the list, has gathered; the oldest once the list holds a quarter
        more than its bound. What is kept a while longer is the oldest instants, which only a
        first token that old could fall near."""
        self.decoding.forget_before(before)
        firsts = self._firsts
        batch = max(1, self._max // 4)
        if len(firsts) > self._max + batch:
            del firsts[:len(firsts) - self._max]
        elif firsts and firsts[0] < before:
            cut = bisect_left(firsts, before)
            if cut >= batch or 2 * cut >= len(firsts):
                del firsts[:cut]


def _runs(times: list[float], held: list[bool]) -> tuple[StepSpan, ...]:
    """Spans of consecutive step instants ``times`` not ``held`` (covered) already."""
    spans: list[StepSpan] = []
    start, count = 0.0, 0  # the run being gathered: its first instant, its length
    for i in range(len(times)):
        if not held[i]:
            if count == 0:
                start = times[i]
            count += 1
        elif count:
            spans.append(StepSpan(start, times[i - 1], float(count)))
            count = 0
    if count:
        spans.append(StepSpan(start, times[-1], float(count)))
    return tuple(spans)
