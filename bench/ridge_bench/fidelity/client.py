"""The fidelity report's client: timed streamed chats, plain requests and engine counters, over
one aiohttp session, the same code against a real engine and a simulated one.

Definitions (seconds from sending the request, tokens from the usage chunk):

- TTFT: until the first chunk that carries generated text;
- decode rate [tokens/s]: tokens after the first / (last text chunk − first text chunk), the
  token count from ``usage.completion_tokens`` (``stream_options.include_usage``), so a chunk
  that carries several tokens (speculative decoding) counts right — as
  ``tests/real_engine/timing.py`` defines it for the calibration;
- counters: every sample of ``/metrics`` summed over its label sets, except ``position``,
  which is kept (``NAME{position=I}``): the per-position speculative counters.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

CHAT_PATH = "/v1/chat/completions"


class FidelityError(RuntimeError):
    """An engine did not answer a request the way the report needs."""


@dataclass(frozen=True, slots=True)
class Timed:
    """One streamed chat completion: times [s] from the request's start, token counts."""

    ttft_s: float
    last_s: float
    prompt_tokens: int
    completion_tokens: int

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first per second of decoding (0 when there is nothing to time)."""
        span = self.last_s - self.ttft_s
        if self.completion_tokens < 2 or span <= 0:
            return 0.0
        return (self.completion_tokens - 1) / span


@dataclass(frozen=True, slots=True)
class Reply:
    """A plain (non-streamed) answer: status and JSON body (``{}`` if it was not JSON)."""

    status: int
    body: Mapping[str, Any]


def _text_in(chunk: Mapping[str, Any]) -> bool:
    return any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or ())


async def stream_chat(session: aiohttp.ClientSession, url: str, body: Mapping[str, Any]
                      ) -> Timed:
    """POST ``body`` streamed to ``url``'s chat endpoint and time it (module docstring)."""
    payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    first: float | None = None
    last = 0.0
    usage: Mapping[str, Any] | None = None
    async with session.post(url + CHAT_PATH, json=payload) as resp:
        if resp.status != 200:
            raise FidelityError(f"{url}: HTTP {resp.status}: {(await resp.text())[:300]}")
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            now = time.perf_counter() - start
            chunk = json.loads(line[6:])
            if _text_in(chunk):
                first = now if first is None else first
                last = now
            usage = chunk.get("usage") or usage
    if first is None or usage is None:
        raise FidelityError(f"{url}: the stream carried no text or no usage chunk")
    return Timed(first, last, int(usage["prompt_tokens"]), int(usage["completion_tokens"]))


async def post_chat(session: aiohttp.ClientSession, url: str, body: Mapping[str, Any]) -> Reply:
    """POST ``body`` (not streamed) to ``url``'s chat endpoint, whatever it answers."""
    async with session.post(url + CHAT_PATH, json=body) as resp:
        try:
            data = await resp.json(content_type=None)
        except ValueError:
            data = {}
        return Reply(resp.status, data if isinstance(data, dict) else {})


async def counters(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """``url``'s ``/metrics`` samples, summed over labels but ``position`` (module docstring)."""
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            pos = sample.labels.get("position")
            key = sample.name if pos is None else f"{sample.name}{{position={pos}}}"
            out[key] = out.get(key, 0.0) + float(sample.value)
    return out
