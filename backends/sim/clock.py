"""Simulated time: a wall clock compressed by a speed factor, or a virtual clock for tests.

All engine times are *simulated* seconds. :class:`ScaledClock` maps them onto the wall clock:
simulated time = (monotonic time − start) · ``speed``, and sleeping T simulated seconds sleeps
T / ``speed`` real seconds (``speed`` = 1: real time; 10: ten times faster). :class:`VirtualClock`
never sleeps: time only moves when the code under test sleeps or waits with a timeout.
:class:`LoopClock` is the running event loop's own clock, so that the engines keep the time of
a :class:`~backends.sim.virtual_loop.VirtualTimeLoop` (virtual time for a whole asyncio
program: the engines, and whatever else runs on that loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Current simulated time [s]."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Let ``seconds`` of simulated time pass (none when ``seconds`` ≤ 0)."""
        ...

    async def wait(self, event: asyncio.Event, timeout: float | None) -> None:
        """Return when ``event`` is set or ``timeout`` simulated seconds passed (None: no limit)."""
        ...

    def real_seconds(self, seconds: float) -> float:
        """Wall-clock seconds that ``seconds`` of simulated time take."""
        ...


class ScaledClock:
    """Wall-clock time scaled by ``speed`` (> 0)."""

    def __init__(self, speed: float = 1.0) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.speed = speed
        self._start = time.monotonic()

    def now(self) -> float:
        return (time.monotonic() - self._start) * self.speed

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self.speed)

    async def wait(self, event: asyncio.Event, timeout: float | None) -> None:
        if timeout is None:
            await event.wait()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), max(0.0, timeout) / self.speed)

    def real_seconds(self, seconds: float) -> float:
        return seconds / self.speed


class VirtualClock:
    """Time that advances only when slept through: deterministic, instant tests."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += max(0.0, seconds)

    async def sleep(self, seconds: float) -> None:
        self.advance(seconds)
        await asyncio.sleep(0)

    async def wait(self, event: asyncio.Event, timeout: float | None) -> None:
        for _ in range(3):
            if event.is_set():
                return
            await asyncio.sleep(0)
        if timeout is None:
            await event.wait()
        else:
            self.advance(timeout)

    def real_seconds(self, seconds: float) -> float:
        """Timers (KV hold and bootstrap timeouts) still run on the wall clock, unscaled."""
        return seconds


class LoopClock(ScaledClock):
    """The running event loop's clock, from the first reading on [s]: on a real loop it is the
    wall clock (``speed`` 1), on a :class:`~backends.sim.virtual_loop.VirtualTimeLoop` its
    virtual time, which sleeps and timeouts advance without waiting."""

    def __init__(self) -> None:
        super().__init__(1.0)
        self._loop_start: float | None = None

    def now(self) -> float:
        now = asyncio.get_running_loop().time()
        if self._loop_start is None:
            self._loop_start = now
        return now - self._loop_start
