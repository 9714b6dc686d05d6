"""``ridge serve --workers 2`` in front of 4 equal simulated engines: the workers route as one
gateway, answer one merged /metrics page, and a worker that dies is replaced.

- Same long prefix, each request on a new connection (the kernel gives new connections to
  either worker) → every request lands on one engine.
- A burst of 64 concurrent distinct requests on separate connections → no engine gets more
  than its fair share (16) + 3 (the engines' own gauges, polled by each worker at its own
  instant, enter every endpoint's load).
- /metrics from any worker counts every worker's requests.
- SIGKILL to a worker: the supervisor starts another; requests go on being served.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.fakes.harness import free_ports
from tests.real_engine.servers import Server, spawn, start_ridge, stop_all, wait_ready, write_fleet

MODEL = "llama-3-8b"
FACTS = {"params": 8.03e9, "layers": 32, "hidden_size": 4096, "kv_heads": 8, "head_dim": 128,
         "dtype_bytes": 2, "max_context": 16384}
L4 = {"name": "l4", "peak_flops": 121e12, "mem_bandwidth": 300e9}
SYSTEM = " ".join(f"Rule {i}: answer politely, cite sources, and keep to the topic." for i in
                  range(60))
ENGINES, BURST, TOLERANCE = 4, 64, 3


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("workers")
    ports = free_ports(ENGINES)
    fleet = write_fleet({"pools": [{
        "name": "main", "engine": "vllm", "models": [MODEL], "model": FACTS, "hardware": L4,
        "levers": {"prefix_caching": True},
        "endpoints": [f"http://127.0.0.1:{p}" for p in ports]}]}, tmp / "fleet.yaml")
    sim = spawn("sim", [sys.executable, "-m", "backends.sim", "--config", str(fleet),
                        "--speed", "5"], dict(os.environ), tmp, f"http://127.0.0.1:{ports[0]}")
    servers = [sim]
    try:
        wait_ready([sim], "/health", 30.0)
        servers.append(start_ridge(fleet, tmp, "ridge", args=["--workers", "2"]))
        yield servers[1]
    finally:
        stop_all(servers)


async def _chat(url: str, content: str, max_tokens: int = 8,
                system: bool = True) -> tuple[int, str]:
    messages = [{"role": "system", "content": SYSTEM}] if system else []
    body = {"model": MODEL, "max_tokens": max_tokens,
            "messages": [*messages, {"role": "user", "content": content}]}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session, \
            session.post(url + "/v1/chat/completions", json=body) as resp:  # a new connection
        await resp.read()
        return resp.status, resp.headers.get("x-ridge-endpoint", "?")


def _workers(gateway: Server) -> list[int]:
    children = Path(f"/proc/{gateway.process.pid}/task/{gateway.process.pid}/children")
    return [int(pid) for pid in children.read_text().split()]


async def test_two_workers_are_running(gateway: Server) -> None:
    assert len(_workers(gateway)) == 2


async def test_same_prefix_through_either_worker_lands_on_one_engine(gateway: Server) -> None:
    seen = [await _chat(gateway.url, f"question {i}") for i in range(10)]
    assert [status for status, _ in seen] == [200] * 10
    assert len({engine for _, engine in seen}) == 1, seen


async def test_a_burst_through_both_workers_spreads_fairly(gateway: Server) -> None:
    await asyncio.sleep(1.5)  # earlier requests leave the engines' gauges
    results = await asyncio.gather(*(
        _chat(gateway.url, f"{1000 + i:05d} " * 20 + "tell me something new", 48, False)
        for i in range(BURST)))
    assert all(status == 200 for status, _ in results), results
    counts = Counter(engine for _, engine in results)
    print(f"burst of {BURST} over {ENGINES} engines, 2 workers: {dict(sorted(counts.items()))}")
    assert max(counts.values()) <= BURST // ENGINES + TOLERANCE, counts


async def test_metrics_from_any_worker_count_every_workers_requests(gateway: Server) -> None:
    before = await _settled_total(gateway)
    for i in range(12):
        assert (await _chat(gateway.url, f"count me {i}"))[0] == 200
    after = await _settled_total(gateway)  # a request is counted just after its last byte
    assert after == before + 12
    totals = {await _requests_total(gateway) for _ in range(6)}  # scrapes land on both workers
    assert totals == {after}


async def test_a_killed_worker_is_replaced_and_serving_goes_on(gateway: Server) -> None:
    victim = _workers(gateway)[0]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        workers = _workers(gateway)
        if len(workers) == 2 and victim not in workers:
            break
        await asyncio.sleep(0.2)
    assert len(_workers(gateway)) == 2 and victim not in _workers(gateway)
    statuses = []
    for i in range(10):
        for _ in range(50):  # the new worker may still be starting: retry refused connections
            try:
                statuses.append((await _chat(gateway.url, f"after {i}"))[0])
                break
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.1)
    assert statuses == [200] * 10
    assert "ended unexpectedly" in Path(gateway.log_path).read_text()


async def _requests_total(gateway: Server) -> float:
    async with aiohttp.ClientSession() as session, \
            session.get(gateway.url + "/metrics") as resp:
        text = await resp.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("ridge_requests_total{") and 'status="200"' in line)


async def _settled_total(gateway: Server) -> float:
    """The request count once two scrapes a moment apart agree (the last request's record
    lands just after its response), or the last one read."""
    total = await _requests_total(gateway)
    for _ in range(50):
        await asyncio.sleep(0.2)
        again = await _requests_total(gateway)
        if again == total:
            break
        total = again
    return total
