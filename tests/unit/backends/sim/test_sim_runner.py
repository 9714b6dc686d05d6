"""The async engine loop on a virtual clock, and the endpoint's request handling."""

from __future__ import annotations

import asyncio

from backends.sim.clock import ScaledClock, VirtualClock
from backends.sim.endpoint import SimEndpoint
from backends.sim.pd import KVTransferHub
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
