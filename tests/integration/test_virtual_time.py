"""ridge in front of its simulated fleet, both on one virtual-time loop
(:mod:`backends.sim.virtual_loop`): real HTTP on loopback, ridge's whole request path, the
engines on the loop's clock. Every streamed answer arrives whole; the HTTP hops take no virtual
time, so the time to first token each client sees is the one its engine recorded; and the
same run twice gives the same virtual times to the last digit."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import aiohttp

from backends.sim import start_fleet
from backends.sim.clock import LoopClock
from backends.sim.virtual_loop import run
from config.fleet import Fleet, parse_fleet
from tests.fakes.harness import free_ports, quick_settings, running_ridge

MODEL = "m"
FACTS = {"params": 8.03e9, "layers": 32, "hidden_size": 4096, "kv_heads": 8, "head_dim": 128,
         "dtype_bytes": 2, "max_context": 8192}
L4 = {"name": "l4", "peak_flops": 121.0e12, "mem_bandwidth": 300.0e9}
REQUESTS = 24
MAX_TOKENS = 24


def _fleet() -> Fleet:
    p = free_ports(3)
    pool = {"engine": "vllm", "models": [MODEL], "model": FACTS, "hardware": L4}
    return parse_fleet({"pools": [
        {**pool, "name": "plain", "endpoints": [f"http://127.0.0.1:{p[0]}"]},
        {**pool, "name": "cached", "endpoints": [f"http://127.0.0.1:{p[1]}",
                                                  f"http://127.0.0.1:{p[2]}"],
         "levers": {"prefix_caching": True, "chunked_prefill": {"token_budget": 512}}},
    ]})


async def _stream(session: aiohttp.ClientSession, url: str, i: int) -> tuple[float, float, int]:
    """One streamed chat, sent at ``i`` × 50 ms: (TTFT, end to end [virtual s], data events)."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(0.05 * i)
    start = loop.time()
    body = {"model": MODEL, "max_tokens": MAX_TOKENS, "stream": True, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"{i % 3} " + "shared context " * 200}]}
    first, events = None, 0
    async with session.post(url + "/v1/chat/completions", json=body) as reply:
        assert reply.status == 200, await reply.text()
        async for line in reply.content:
            if line.startswith(b"data: {"):
                first = loop.time() - start if first is None else first
                events += 1
    assert first is not None
    return first, loop.time() - start, events


async def _run() -> tuple[list[tuple[float, float, int]], float]:
    """The answers, and the sum of the engines' own TTFTs [virtual s]."""
    fleet = _fleet()
    sim = await start_fleet(fleet, seed=5, clock=LoopClock())
    try:
        async with running_ridge(fleet, quick_settings(admission={"enabled": False})) as ridge, \
                aiohttp.ClientSession() as session:
            answers = await asyncio.gather(*(_stream(session, ridge.url, i)
                                             for i in range(REQUESTS)))
        engines = sum(s.endpoint.core.stats.histograms["ttft_s"].sum for s in sim.servers)
    finally:
        await sim.stop()
    return list(answers), engines


def _ttfts(answers: Sequence[tuple[float, float, int]]) -> float:
    return sum(ttft for ttft, _, _ in answers)


def test_ridge_and_its_simulated_fleet_run_on_virtual_time() -> None:
    answers, engines = run(_run())
    assert all(events >= MAX_TOKENS for _, _, events in answers)  # every token, and the usage
    assert all(0 < ttft <= e2e for ttft, e2e, _ in answers)
    assert abs(_ttfts(answers) - engines) < 1e-6  # HTTP and routing took no virtual time
    again, _ = run(_run())
    assert again == answers
