"""backends.sim.clock's LoopClock: the running loop's time from its first reading, so that on a
virtual-time loop the engines' sleeps and timeouts are the loop's own."""

from __future__ import annotations

import asyncio

from backends.sim.clock import LoopClock
from backends.sim.virtual_loop import run


def test_the_loop_clock_starts_at_zero_and_follows_the_loops_sleeps() -> None:
    async def main() -> tuple[float, float, float]:
        await asyncio.sleep(2.0)  # before the clock's first reading: not counted
        clock = LoopClock()
        start = clock.now()
        await clock.sleep(1.5)
        slept = clock.now()
        await clock.wait(asyncio.Event(), 0.25)  # never set: the timeout passes
        return start, slept, clock.now()

    assert run(main()) == (0.0, 1.5, 1.75)


def test_a_set_event_ends_the_wait_before_its_timeout() -> None:
    async def main() -> float:
        clock = LoopClock()
        clock.now()
        event = asyncio.Event()
        asyncio.get_running_loop().call_later(0.5, event.set)
        await clock.wait(event, 10.0)
        return clock.now()

    assert run(main()) == 0.5


def test_on_a_real_loop_it_is_the_wall_clock() -> None:
    async def main() -> tuple[float, float]:
        clock = LoopClock()
        return clock.now(), clock.real_seconds(3.0)

    start, real = asyncio.run(main())
    assert start == 0.0 and real == 3.0
