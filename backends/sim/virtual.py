"""Run an :class:`~backends.sim.engine.EngineCore` on virtual time, without asyncio or sleeping.

A discrete-event loop: requests arrive at given simulated times; whenever the engine has work it
steps and time jumps by the step's duration; when it is idle time jumps to the next arrival (or
the next moment a waiting request becomes runnable). Used by tests and for what-if numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from backends.sim.engine import EngineCore
from backends.sim.request import SimRequest


@dataclass(slots=True)
class Trace:
    """Per request id: (time, tokens) of every step that produced tokens; step start times."""

    tokens: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    step_starts: list[float] = field(default_factory=list)
    end: float = 0.0

    def first_token(self, rid: str) -> float:
        return self.tokens[rid][0][0]

    def last_token(self, rid: str) -> float:
        return self.tokens[rid][-1][0]

    def gaps(self, rid: str) -> list[float]:
        """Times between consecutive token deliveries of ``rid`` [s]."""
        times = [t for t, _ in self.tokens.get(rid, [])]
        return [b - a for a, b in zip(times, times[1:], strict=False)]


def simulate(
    core: EngineCore,
    arrivals: Sequence[tuple[float, SimRequest]],
    *,
    until: float = float("inf"),
    max_steps: int = 1_000_000,
) -> Trace:
    """Feed ``arrivals`` ((time, request), any order) to ``core`` and run until all are done,
    ``until`` simulated seconds, or ``max_steps`` steps."""
    pending = sorted(arrivals, key=lambda a: a[0])
    trace = Trace()
    now, i = 0.0, 0
    for _ in range(max_steps):
        while i < len(pending) and pending[i][0] <= now:
            req = pending[i][1]
            req.arrival = pending[i][0]
            core.add(req)
            i += 1
        out = core.step(now)
        if out.idle:
            upcoming = [t for t in (_next(pending, i), core.next_event_time(now)) if t is not None]
            if not upcoming or min(upcoming) > until:
                break
            now = max(now, min(upcoming))
            continue
        trace.step_starts.append(now)
        now += out.seconds
        for e in out.emissions:
            trace.tokens.setdefault(e.request.rid, []).append((now, len(e.tokens)))
        if now > until:
            break
    trace.end = now
    return trace


def _next(pending: Sequence[tuple[float, SimRequest]], i: int) -> float | None:
    return pending[i][0] if i < len(pending) else None
