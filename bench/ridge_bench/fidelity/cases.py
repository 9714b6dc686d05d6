"""The fidelity report's measurements: the same requests, in the same order, against one side
(the real engines or the simulated ones) of a fleet with a "plain" pool (prefix caching,
chunked prefill) and a "spec" pool (n-gram speculative decoding).

Per repeat, greedy, ``ignore_eos`` wherever a decode rate is timed: ``short`` and ``long``
TTFTs; ``prefix`` (cold, then with its blocks cached); ``decode`` (one stream's rate);
``concurrent`` (N new requests at once, each N of ``concurrency``); ``copy`` and ``chat`` on
plain, then on spec, with the spec engine's draft counters around the spec runs. Once, after
the repeats: the three error cases (``errors``). Every request's ``usage.prompt_tokens`` is
kept, in order, per case. See docs/benchmarks/fidelity.md#the-cases.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ridge_bench.fidelity import prompts
from ridge_bench.fidelity.client import Timed, counters, post_chat, stream_chat

DRAFTS = "vllm:spec_decode_num_drafts_total"
ACCEPTED_AT = "vllm:spec_decode_num_accepted_tokens_per_pos_total{{position={}}}"
Results = dict[str, Any]


@dataclass(frozen=True)
class FidelitySetup:
    """What to measure: repeats, token counts [tokens], concurrency levels, timeouts [s]."""

    repeats: int = 3
    decode_tokens: int = 64
    copy_tokens: int = 200
    chat_tokens: int = 96
    concurrency: tuple[int, ...] = (4, 8)
    spec_k: int = 4
    errors: bool = True
    timeout_s: float = 300.0
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    """Makes this run's prompts unique (the same on both sides)."""


@dataclass(frozen=True)
class Side:
    """One side of the comparison: the plain and spec pools' URLs and the model name."""

    name: str
    plain: str
    spec: str
    model: str


def body(side: Side, messages: prompts.Messages, max_tokens: int) -> dict[str, Any]:
    return {"model": side.model, "messages": messages, "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True}


def _add(out: Results, case: str, key: str, value: Any) -> None:
    out.setdefault(case, {}).setdefault(key, []).append(value)


def _tokens(out: Results, case: str, *runs: Timed) -> None:
    for run in runs:
        _add(out, case, "prompt_tokens", run.prompt_tokens)


async def ttft_cases(s: aiohttp.ClientSession, side: Side, setup: FidelitySetup, r: int,
                     out: Results) -> None:
    """``short``, ``long`` and ``prefix`` for repeat ``r``."""
    short = await stream_chat(s, side.plain, body(side, prompts.user(prompts.SHORT_QUESTION), 4))
    long = await stream_chat(s, side.plain, body(side, prompts.long_prompt(setup.tag, r), 4))
    system = prompts.library_prompt(setup.tag, r)
    cold, cached = [await stream_chat(s, side.plain,
                                      body(side, prompts.shared_prefix(system, q), 4))
                    for q in prompts.PREFIX_QUESTIONS]
    _add(out, "short", "ttft_s", short.ttft_s)
    _add(out, "long", "ttft_s", long.ttft_s)
    _add(out, "prefix", "cold_ttft_s", cold.ttft_s)
    _add(out, "prefix", "cached_ttft_s", cached.ttft_s)
    _tokens(out, "short", short)
    _tokens(out, "long", long)
    _tokens(out, "prefix", cold, cached)


async def decode_cases(s: aiohttp.ClientSession, side: Side, setup: FidelitySetup,
                       out: Results) -> None:
    """``decode`` and every ``concurrent`` level, once."""
    one = await stream_chat(s, side.plain, body(side, prompts.story(0), setup.decode_tokens))
    _add(out, "decode", "tokens_per_s", one.decode_tokens_per_s)
    _tokens(out, "decode", one)
    for n in setup.concurrency:
        runs = await asyncio.gather(*(stream_chat(s, side.plain, body(side, prompts.story(i),
                                                                      setup.decode_tokens))
                                      for i in range(n)))
        case = f"concurrent_{n}"
        _add(out, case, "ttft_s", sorted(r.ttft_s for r in runs))
        _add(out, case, "total_tokens_per_s", sum(r.decode_tokens_per_s for r in runs))
        _tokens(out, case, *runs)


async def lever_case(s: aiohttp.ClientSession, side: Side, setup: FidelitySetup, case: str,
                     messages: prompts.Messages, max_tokens: int, out: Results) -> None:
    """One task on plain then on spec; the spec engine's counters around the spec run."""
    request = body(side, messages, max_tokens)
    plain = await stream_chat(s, side.plain, request)
    before = await counters(s, side.spec)
    spec = await stream_chat(s, side.spec, request)
    after = await counters(s, side.spec)
    _add(out, case, "plain_tokens_per_s", plain.decode_tokens_per_s)
    _add(out, case, "spec_tokens_per_s", spec.decode_tokens_per_s)
    _add(out, case, "spec_completion_tokens", spec.completion_tokens)
    _add(out, case, "drafts", after.get(DRAFTS, 0.0) - before.get(DRAFTS, 0.0))
    _add(out, case, "accepted_per_position", [
        after.get(ACCEPTED_AT.format(i), 0.0) - before.get(ACCEPTED_AT.format(i), 0.0)
        for i in range(setup.spec_k)])
    _tokens(out, case, plain, spec)


def _error(reply_body: Mapping[str, Any]) -> Mapping[str, Any]:
    nested = reply_body.get("error")
    return nested if isinstance(nested, Mapping) else reply_body


async def error_cases(s: aiohttp.ClientSession, side: Side) -> dict[str, dict[str, Any]]:
    """The three error edge cases: status, type, param, message of each."""
    short = prompts.user(prompts.SHORT_QUESTION)
    bodies: dict[str, dict[str, Any]] = {
        "prompt over the context": body(side, prompts.over_context(), 16),
        "max_tokens over the context": body(side, short, 4096),
        "no messages (malformed body)": {"model": side.model, "max_tokens": 4},
    }
    out = {}
    for name, request in bodies.items():
        reply = await post_chat(s, side.plain, request)
        err = _error(reply.body)
        out[name] = {"status": reply.status, "type": err.get("type"),
                     "param": err.get("param"), "message": err.get("message")}
    return out


async def measure(setup: FidelitySetup, side: Side) -> Results:
    """Every case of the module docstring against ``side``; raw figures, per repeat."""
    out: Results = {}
    limit = max((*setup.concurrency, 1))
    timeout = aiohttp.ClientTimeout(total=setup.timeout_s)
    # a new connection per request: an engine closing an idle keep-alive connection just as a
    # request goes out (uvicorn, after 5 s) must not fail the run
    connector = aiohttp.TCPConnector(limit=limit, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as s:
        await stream_chat(s, side.plain, body(side, prompts.user("Hello."), 2))  # warm-up
        await stream_chat(s, side.spec, body(side, prompts.user("Hello."), 2))
        for r in range(setup.repeats):
            await ttft_cases(s, side, setup, r, out)
            await decode_cases(s, side, setup, out)
            await lever_case(s, side, setup, "copy", prompts.user(prompts.COPY_PROMPT),
                             setup.copy_tokens, out)
            await lever_case(s, side, setup, "chat", prompts.user(prompts.CHAT_QUESTION),
                             setup.chat_tokens, out)
        if setup.errors:
            out["errors"] = await error_cases(s, side)
    return out
