"""The fidelity client against a canned engine: what counts as the first token, tokens from
the usage chunk, errors, and per-position counters."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from ridge_bench.fidelity.client import FidelityError, counters, post_chat, stream_chat

METRICS = """\
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 7.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 5.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 3.0
"""


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if "messages" not in body:
        return web.json_response({"error": {"message": "no", "type": "Bad Request",
                                            "param": "body.messages", "code": 400}}, status=400)
    if not body.get("stream"):
        return web.json_response({"usage": {"prompt_tokens": 3}})
    resp = web.StreamResponse()
    await resp.prepare(request)
    await resp.write(_sse({"choices": [{"delta": {"role": "assistant", "content": ""}}]}))
    for piece in ("He", "llo wor", "ld"):  # the second chunk carries two tokens
        await resp.write(_sse({"choices": [{"delta": {"content": piece}}]}))
    await resp.write(_sse({"choices": [], "usage": {"prompt_tokens": 9,
                                                    "completion_tokens": 4}}))
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def metrics(request: web.Request) -> web.Response:
    return web.Response(text=METRICS)


@pytest.fixture
async def engine() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_a_stream_is_timed_from_its_first_text_with_the_usage_tokens(engine: str) -> None:
    async with aiohttp.ClientSession() as s:
        timed = await stream_chat(s, engine, {"messages": []})
    assert (timed.prompt_tokens, timed.completion_tokens) == (9, 4)
    assert 0 < timed.ttft_s <= timed.last_s
    span = timed.last_s - timed.ttft_s
    assert timed.decode_tokens_per_s == pytest.approx(3 / span if span > 0 else 0.0)


async def test_an_error_answer_is_kept_whole(engine: str) -> None:
    async with aiohttp.ClientSession() as s:
        reply = await post_chat(s, engine, {"model": "m"})
        with pytest.raises(FidelityError, match="HTTP 400"):
            await stream_chat(s, engine, {"model": "m"})
    assert reply.status == 400 and reply.body["error"]["param"] == "body.messages"


async def test_counters_keep_the_draft_position(engine: str) -> None:
    async with aiohttp.ClientSession() as s:
        got = await counters(s, engine)
    assert got["vllm:spec_decode_num_drafts_total"] == 7.0
    assert got["vllm:spec_decode_num_accepted_tokens_per_pos_total{position=1}"] == 3.0
