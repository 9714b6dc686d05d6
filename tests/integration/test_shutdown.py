"""SIGTERM to a real ``ridge serve``: it drains, then stops, and no request in flight is lost.

A stream of 15 tokens, 0.2 s apart, is under way when SIGTERM arrives; ridge runs with a 2 s
drain, as one process and as two workers (the supervisor passes SIGTERM on to each). Checked:
``/ready`` answers 503 from then on, a new request during the drain is still served, the stream
under way ends whole (every token, ``[DONE]``), and the process exits by itself (uvicorn ends
with the signal it stopped for). Waits are bounded generously; nothing depends on a tight
deadline."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.fakes.engine import FakeEngine
from tests.real_engine.servers import Server, start_ridge, stop_all, write_fleet

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="signals to a subprocess")

FACTS = {"params": 8.03e9, "layers": 32, "hidden_size": 4096, "kv_heads": 8, "head_dim": 128,
         "dtype_bytes": 2, "max_context": 16384}
L4 = {"name": "l4", "peak_flops": 121e12, "mem_bandwidth": 300e9}
WAIT_S = 60.0


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    fake = FakeEngine(model="m", token_interval_s=0.2)
    await fake.start()
    yield fake
    await fake.stop()


async def _stream(url: str, first: asyncio.Event) -> bytes:
    body = {"model": "m", "max_tokens": 15, "stream": True,
            "messages": [{"role": "user", "content": "count"}]}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as session, \
            session.post(url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        data = b""
        async for chunk in resp.content.iter_any():
            data += chunk
            first.set()
        return data


async def _get(url: str, path: str) -> int:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as session, \
            session.get(url + path) as resp:
        return resp.status


async def _chat(url: str) -> int:
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as session, \
            session.post(url + "/v1/chat/completions", json=body) as resp:
        await resp.read()
        return resp.status


@pytest.mark.parametrize("workers", [1, 2])
async def test_sigterm_drains_then_stops_without_losing_a_request(
        engine: FakeEngine, tmp_path: Path, workers: int) -> None:
    fleet = write_fleet({"pools": [{"name": "main", "engine": "vllm", "models": ["m"],
                                    "model": FACTS, "hardware": L4,
                                    "endpoints": [engine.url]}]}, tmp_path / "fleet.yaml")
    env = {"RIDGE_DRAIN_S": "2", "RIDGE_SHUTDOWN_TIMEOUT_S": "30"}
    server: Server = await asyncio.to_thread(start_ridge, fleet, tmp_path, "ridge", env, 60.0,
                                             ["--workers", str(workers)])
    try:
        assert await _get(server.url, "/ready") == 200
        first = asyncio.Event()
        stream = asyncio.create_task(_stream(server.url, first))
        await asyncio.wait_for(first.wait(), WAIT_S)
        server.process.send_signal(signal.SIGTERM)
        for _ in range(int(WAIT_S * 10)):
            if await _get(server.url, "/ready") == 503:
                break
            await asyncio.sleep(0.1)
        assert await _get(server.url, "/ready") == 503  # draining, still answering
        assert await _chat(server.url) == 200  # and still serving
        events = (await stream).split(b"\n\n")
        tokens = [e for e in events if b'"content":"' in e.replace(b" ", b"")
                  and b'"content":""' not in e.replace(b" ", b"")]
        assert len(tokens) == 15 and events[-2] == b"data: [DONE]"
        code = await asyncio.to_thread(server.process.wait, WAIT_S)
        # uvicorn re-raises the signal it stopped for once it is done: a SIGTERM exit
        assert code in (0, -signal.SIGTERM), server.log_tail()
        assert "Traceback" not in server.log_path.read_text()
    finally:
        await asyncio.to_thread(stop_all, [server])
