"""Redis memory stays bounded: a million distinct prompts routed through the RedisState script.

The state is driven directly (no HTTP): each prompt's ``finish`` (release + record its blocks
as cached on one of 4 endpoints + feed the model's windows) is the very call RedisState makes,
sent in pipelined batches so that a million fit in the test's time. With
``max_prefix_entries`` = :data:`MAX_ENTRIES`, the prefix LRU must hold at most that many
entries and ``used_memory`` must stay under :data:`MEMORY_CAP` throughout; the figures are
printed (run with ``-s``).
"""

from __future__ import annotations

import json
import time

from redis.asyncio import Redis

from gateway.state.redis import RedisState
from gateway.state.redis_script import SCRIPT
from routing.features import block_hashes
from routing.state.memory import StateLimits
from routing.state.protocol import Outcome, Reservation
from tests.integration.redis_server import running_redis

PROMPTS = 1_000_000
BLOCKS = 2  # full blocks per prompt (distinct from the first block on)
MAX_ENTRIES = 100_000
MEMORY_CAP = 32 * 1024 * 1024  # bytes: ~100 B per LRU entry × 100k, the rest a margin
BATCH = 2_000


async def test_a_million_prompts_keep_redis_under_its_cap() -> None:
    limits = StateLimits(max_prefix_entries=MAX_ENTRIES)
    with running_redis(maxmemory="512mb") as server:
        state = RedisState.from_url(server.url, limits, timeout_s=5.0)
        client = Redis.from_url(server.url, decode_responses=True)
        sha = await client.script_load(SCRIPT)
        peak, started = 0, time.monotonic()
        try:
            for start in range(0, PROMPTS, BATCH):
                pipe = client.pipeline(transaction=False)
                for i in range(start, start + BATCH):
                    pipe.evalsha(sha, 0, _finish_arg(state, i))
                await pipe.execute()
                if start % 100_000 == 0:
                    peak = max(peak, int((await client.info("memory"))["used_memory"]))
            info = await client.info("memory")
            entries = await client.zcard("ridge:prefix:lru")
        finally:
            await client.aclose()
            await state.aclose()
    seconds = time.monotonic() - started
    used = int(info["used_memory"])
    print(f"\n{PROMPTS} prompts × {BLOCKS} blocks in {seconds:.1f} s: prefix entries {entries}"
          f" (cap {MAX_ENTRIES}), used_memory {used / 2**20:.1f} MiB, sampled peak "
          f"{max(peak, used) / 2**20:.1f} MiB, used_memory_peak "
          f"{int(info['used_memory_peak']) / 2**20:.1f} MiB (cap {MEMORY_CAP / 2**20:.0f} MiB)")
    assert entries == MAX_ENTRIES
    assert int(info["used_memory_peak"]) < MEMORY_CAP


def _finish_arg(state: RedisState, i: int) -> str:
    hashes = block_hashes(f"{i:09d}|" * 13, 64, seed="m")[:BLOCKS]
    outcome = Outcome(model="m", block_hashes=hashes, prompt_tokens=40, matched_tokens=0,
                      output_tokens=10, session=None, succeeded=True)
    args = state._finish_args(Reservation(f"r:x-{i}", f"http://e{i % 4}", 50), outcome,
                              [f"r:x-{i}"])
    args.update(p="ridge:", now=time.time(), lim=state._lim)
    return json.dumps(args)
