"""What sharing the router state in Redis adds per request:
``python -m ridge_bench.overhead.state_latency``.

Per request, the state calls on the hot path: ``place`` (read, the default scheduler's plugins
choose, conditional reserve: two Redis round trips when no other gateway competes) and
``finish`` (release + learn, one round trip). This times
both for :class:`routing.state.memory.MemoryState` and for :class:`gateway.state.redis.RedisState`
on a redis-server started on 127.0.0.1 (Debian's ``redis-server``), sequentially (one request
at a time, so the figure is the latency, not a throughput), over ``--requests`` requests of a
chat-sized prompt (``--blocks`` hashed blocks, half of them shared by all prompts) on 4
endpoints. Prints p50 and p99 per state and the difference [microseconds].
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from statistics import quantiles

from gateway.state.redis import RedisState
from routing.features import RequestFeatures, block_hashes
from routing.scheduler import SchedulerConfig, SchedulingContext, build_scheduler
from routing.snapshots import EndpointSnapshot, PoolSnapshot
from routing.state.memory import MemoryState
from routing.state.protocol import Ask, Outcome, RouterState, StateView

ENDPOINTS = tuple(f"http://127.0.0.1:{9000 + i}" for i in range(4))
POOL = PoolSnapshot("p", "vllm", "mixed", ("m",),
                    tuple(EndpointSnapshot(u, "p", True) for u in ENDPOINTS))


@dataclass(frozen=True)
class Pick:
    urls: tuple[str, ...]


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """A throw-away redis-server on a free 127.0.0.1 port (no persistence); its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server missing: bash deploy/apt-install.sh redis-server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="ridge-bench-redis-")
    proc = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                             "--appendonly", "no", "--dir", workdir],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                break
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def features(i: int, blocks: int) -> RequestFeatures:
    shared = "system prompt " * (blocks * 2)
    hashes = block_hashes(shared[: blocks * 32] + f"{i:08d}" * (blocks * 4), 64, seed="m")
    return RequestFeatures("m", hashes[:blocks], 16, blocks * 16, 256, 256, None, False)


async def run(state: RouterState, n: int, blocks: int) -> list[float]:
    """Microseconds per request: place (the default scheduler choosing) + finish."""
    scheduler = build_scheduler(SchedulerConfig())
    took = []
    for i in range(n):
        f = features(i, blocks)

        def choose(view: StateView, f: RequestFeatures = f) -> Pick | None:
            pick = scheduler.schedule(SchedulingContext(f, POOL, view)).endpoint
            return Pick((pick.url,)) if pick is not None else None

        start = time.perf_counter()
        placed = await state.place(Ask("m", f.block_hashes, None, ENDPOINTS, 512), choose)
        assert placed is not None
        await state.finish(placed.reservations[0], Outcome(
            "m", f.block_hashes, f.prompt_tokens, 0, 100, None, True))
        took.append((time.perf_counter() - start) * 1e6)
    return took


def summary(name: str, took: list[float]) -> tuple[float, float]:
    cuts = quantiles(took, n=100)
    print(f"{name:>12}: p50 {cuts[49]:8.1f} µs   p99 {cuts[98]:8.1f} µs   ({len(took)} requests)")
    return cuts[49], cuts[98]


async def main(n: int, blocks: int) -> None:
    memory = summary("memory", await run(MemoryState(), n, blocks))
    with redis_server() as url:
        state = RedisState.from_url(url, timeout_s=1.0)
        await run(state, min(n, 200), blocks)  # warm: script loaded, connection open
        took = await run(state, n, blocks)
        assert state.up, "Redis failed during the benchmark"
        await state.aclose()
    shared = summary("redis", took)
    print(f"{'added':>12}: p50 {shared[0] - memory[0]:8.1f} µs   "
          f"p99 {shared[1] - memory[1]:8.1f} µs")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--blocks", type=int, default=60, help="hashed blocks per prompt")
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.blocks))


if __name__ == "__main__":
    cli()
