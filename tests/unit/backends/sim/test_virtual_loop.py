"""backends.sim.virtual_loop: timers fire at their virtual times, in order, with no waiting;
ready work runs before time moves; threads and call_soon_threadsafe still work; a program
that can never go on raises; and a simulated engine run by its real-time runner on the loop
delivers every token at the time the discrete-event simulation gives."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time

import pytest

from backends.sim.clock import LoopClock
from backends.sim.runner import EngineRunner
from backends.sim.virtual import simulate
from backends.sim.virtual_loop import VirtualDeadlock, VirtualTimeLoop, run
from tests.unit.backends.sim.sim_helpers import make_core, make_pool, make_request


def test_an_hour_of_sleep_passes_at_once_in_virtual_time() -> None:
    async def main() -> float:
        await asyncio.sleep(3600.0)
        return asyncio.get_running_loop().time()

    wall = time.monotonic()
    assert run(main()) == 3600.0
    assert time.monotonic() - wall < 600.0  # nothing slept the hour


def test_timers_fire_in_order_at_their_own_times() -> None:
    fired: list[tuple[str, float]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        for name, delay in (("c", 7.5), ("a", 0.25), ("b", 3.0)):
            loop.call_later(delay, lambda n=name: fired.append((n, loop.time())))
        loop.call_later(10.0, done.set_result, None)
        await done

    run(main())
    assert fired == [("a", 0.25), ("b", 3.0), ("c", 7.5)]


def test_a_timeout_expires_at_its_virtual_time() -> None:
    async def main() -> float:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 5.0)
        return asyncio.get_running_loop().time()

    assert run(main()) == 5.0


def test_ready_work_runs_before_time_moves() -> None:
    async def main() -> tuple[float, int]:
        loop = asyncio.get_running_loop()
        turns = 0

        async def busy() -> None:
            nonlocal turns
            for _ in range(1000):
                turns += 1
                await asyncio.sleep(0)

        sleeper = asyncio.create_task(asyncio.sleep(1.0))
        await busy()
        at = loop.time()
        await sleeper
        return at, turns

    assert run(main()) == (0.0, 1000)


def test_a_wait_for_a_moment_a_hair_ahead_moves_the_clock() -> None:
    """A program waiting until ``target`` with a timeout of ``target - now``, over and over,
    must get there: asyncio runs a timer due within its clock resolution at once when other
    work is ready (here the waiting task), which on virtual time would leave the clock
    standing still for ever."""

    async def main() -> int:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(114.431)
        target = loop.time() + 1e-14  # a hair ahead: what a float's rounding leaves
        never = asyncio.Event()
        waits = 0
        while loop.time() < target and waits < 1000:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(never.wait(), target - loop.time())
            waits += 1
        return waits

    assert run(main()) == 1


def test_threads_and_call_soon_threadsafe_still_wake_the_loop() -> None:
    async def main() -> int:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, lambda: sum(range(10)))

    assert run(main()) == 45


def test_a_program_that_waits_for_nothing_that_can_come_raises() -> None:
    async def main() -> None:
        await asyncio.Event().wait()

    with pytest.raises(VirtualDeadlock, match="waits forever"):
        run(main(), deadlock_after_s=0.0)


def test_the_loop_is_an_ordinary_selector_loop_to_the_program() -> None:
    loop = VirtualTimeLoop()
    try:
        assert isinstance(loop, asyncio.AbstractEventLoop) and loop.time() == 0.0
    finally:
        loop.close()


def _requests(seed: int) -> list[tuple[float, str, int, int]]:
    """(arrival [s], id, prompt tokens, max tokens): a burst, then stragglers."""
    rng = random.Random(seed)
    return [(round(rng.uniform(0.0, 0.6 if i < 8 else 4.0), 6), f"r{i}",
             rng.choice((40, 300, 1500, 4000)), rng.choice((8, 32, 96)))
            for i in range(16)]


@pytest.mark.parametrize(("chunk", "prefix_caching"), [(None, False), (512, True)])
def test_the_real_time_runner_on_virtual_time_keeps_the_simulations_times(
        chunk: int | None, prefix_caching: bool) -> None:
    pool = make_pool(chunk=chunk, prefix_caching=prefix_caching)
    plan = _requests(seed=3)
    expected = simulate(make_core(pool), [(t, make_request(rid, p, m, prefix="shared " * 40))
                                          for t, rid, p, m in plan])

    async def main() -> dict[str, list[tuple[float, int]]]:
        clock = LoopClock()
        clock.now()  # the clock's zero is the loop's
        runner = EngineRunner(make_core(pool), clock)
        runner.start()
        seen: dict[str, list[tuple[float, int]]] = {}

        async def one(at: float, rid: str, prompt: int, max_tokens: int) -> None:
            await asyncio.sleep(at)
            handle = runner.submit(make_request(rid, prompt, max_tokens,
                                                prefix="shared " * 40))
            while True:
                batch, finish = await handle.next_batch()
                if batch:
                    seen.setdefault(rid, []).append((clock.now(), len(batch)))
                if finish is not None:
                    return

        await asyncio.gather(*(one(*r) for r in plan))
        await runner.stop()
        return seen

    seen = run(main())
    assert set(seen) == set(expected.tokens)
    for rid, deliveries in expected.tokens.items():
        assert sum(n for _, n in seen[rid]) == sum(n for _, n in deliveries), rid
        assert seen[rid][0][0] == pytest.approx(deliveries[0][0], abs=1e-9), rid
        assert seen[rid][-1][0] == pytest.approx(deliveries[-1][0], abs=1e-9), rid
