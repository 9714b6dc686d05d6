"""The async engine loop on a virtual clock, and the endpoint's request handling."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from backends.sim.clock import ScaledClock, VirtualClock
from backends.sim.endpoint import SimEndpoint
from backends.sim.engine import EngineCore, StepOutcome
from backends.sim.pd import KVTransferHub
from backends.sim.runner import EngineRunner
from routing.formulas import StepCost
from tests.unit.backends.sim.sim_helpers import make_pool


def endpoint(**kw: object) -> SimEndpoint:
    return SimEndpoint(make_pool(**kw), 0, 1, VirtualClock(), KVTransferHub(), 0)  # type: ignore[arg-type]


async def test_tokens_stream_out_step_by_step_on_virtual_time() -> None:
    ep = endpoint()
    ep.runner.start()
    try:
        gen = ep.parse("chat", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
        handle = ep.submit(gen, "r1", None)
        batches = []
        while True:
            pieces, finish = await asyncio.wait_for(handle.next_batch(), 5)
            batches.append(pieces)
            if finish:
                break
        assert finish == "length" and sum(len(b) for b in batches) == 8 and len(batches) >= 2
        assert ep.clock.now() > 8 * 0.005  # eight memory-bound 8B steps went by, virtually
    finally:
        await ep.runner.stop()


async def test_abort_takes_the_request_out_of_the_running_batch() -> None:
    ep = endpoint()
    ep.runner.start()
    try:
        gen = ep.parse("completion", {"prompt": "x" * 800, "max_tokens": 1000})
        handle = ep.submit(gen, "r1", None)
        await asyncio.wait_for(handle.next_batch(), 5)
        assert ep.core.num_running == 1
        ep.runner.abort(handle)
        assert ep.core.num_running == 0 and ep.core.pool.usage == 0
        assert ep.core.stats.finished["abort"] == 1
    finally:
        await ep.runner.stop()


async def test_natural_stop_lengths_are_seeded_and_honour_ignore_eos() -> None:
    ep = endpoint(knobs={"mean_output_tokens": 5})
    lengths = []
    for seed in range(40):
        gen = ep.parse("completion", {"prompt": "x", "max_tokens": 50, "seed": seed})
        lengths.append(ep._request(gen, f"r{seed}").max_tokens)
    assert 2 <= sum(lengths) / len(lengths) <= 9 and min(lengths) >= 1
    again = [
        ep._request(
            ep.parse("completion", {"prompt": "x", "max_tokens": 50, "seed": s}), "x"
        ).max_tokens
        for s in range(40)
    ]
    assert again == lengths
    gen = ep.parse("completion", {"prompt": "x", "max_tokens": 50, "ignore_eos": True})
    assert ep._request(gen, "y").max_tokens == 50


async def test_scaled_clock_compresses_time() -> None:
    clock = ScaledClock(speed=100.0)
    start = clock.now()
    await clock.sleep(1.0)  # one simulated second is 10 ms of wall time
    assert clock.now() - start >= 0.9
    assert clock.real_seconds(5.0) == 0.05


async def test_second_turn_hits_the_cache_on_the_whole_history() -> None:
    ep = endpoint(prefix_caching=True)
    ep.runner.start()
    try:
        history = [{"role": "user", "content": "Tell me something long. " * 20}]
        first = ep.parse("chat", {"messages": history, "max_tokens": 64})
        reply, _ = await asyncio.wait_for(ep.submit(first, "t1", None).collect(), 5)
        turn = [
            *history,
            {"role": "assistant", "content": "".join(reply)},
            {"role": "user", "content": "And then?"},
        ]
        second = ep.parse("chat", {"messages": turn, "max_tokens": 4})
        await asyncio.wait_for(ep.submit(second, "t2", None).collect(), 5)
        history_tokens = first.prompt_tokens + 64
        block = ep.core.pool.block_size
        # every full block of prompt + reply is reused (the last token's block is recomputed)
        assert ep.core.stats.prefix_hits >= (history_tokens - 1) // block * block
    finally:
        await ep.runner.stop()


class _ComputingCore:
    """A core whose ``steps`` steps each last ``duration`` simulated seconds and take
    ``compute`` of them to compute (the clock moves on while it steps), then idle."""

    def __init__(self, clock: VirtualClock, steps: int, duration: float, compute: float) -> None:
        self.clock, self.left, self.duration, self.compute = clock, steps, duration, compute
        self.starts: list[float] = []

    def step(self, now: float) -> StepOutcome:
        if not self.left:
            return StepOutcome(0.0, [])
        self.left -= 1
        self.starts.append(now)
        self.clock.advance(self.compute)
        return StepOutcome(self.duration, [], StepCost(0, 0, 0, 0, 0, 0, self.duration))

    def next_event_time(self, now: float) -> float | None:
        return None


async def _run_out(core: _ComputingCore, clock: VirtualClock) -> None:
    """Run ``core`` on an engine runner until its steps are done."""
    runner = EngineRunner(cast(EngineCore, core), clock)
    runner.start()
    try:
        for _ in range(100):
            if not core.left:
                break
            await asyncio.sleep(0)
    finally:
        await runner.stop()


async def test_a_steps_own_computing_time_falls_inside_its_duration() -> None:
    clock = VirtualClock()
    core = _ComputingCore(clock, steps=5, duration=0.010, compute=0.004)
    await _run_out(core, clock)
    # each step starts one duration after the last: 0, 10, 20, 30, 40 ms, not 14 ms apart
    assert core.starts == pytest.approx([0.0, 0.010, 0.020, 0.030, 0.040])


async def test_a_step_that_computes_longer_than_it_lasts_delays_the_next() -> None:
    clock = VirtualClock()
    core = _ComputingCore(clock, steps=3, duration=0.010, compute=0.025)
    await _run_out(core, clock)
    assert core.starts == pytest.approx([0.0, 0.025, 0.050])  # no negative sleep


class _LateClock(VirtualClock):
    """Virtual time whose every sleep ends ``late`` seconds after it should (a busy host)."""

    def __init__(self, late: float) -> None:
        super().__init__()
        self.late = late

    async def sleep(self, seconds: float) -> None:
        await super().sleep(max(0.0, seconds) + self.late)


async def test_steps_keep_their_pace_when_the_host_wakes_the_loop_late() -> None:
    clock = _LateClock(late=0.003)
    core = _ComputingCore(clock, steps=5, duration=0.010, compute=0.0)
    await _run_out(core, clock)
    # late by 3 ms once, then every step 10 ms after the last (not 13 ms): the pace is kept
    assert core.starts == pytest.approx([0.0, 0.013, 0.023, 0.033, 0.043])
