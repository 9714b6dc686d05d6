"""A client that goes away stops the engine's work: ridge must cancel the upstream request.

Each request asks for 1500 tokens with ``ignore_eos`` (about a minute of decoding here), so
the engine would keep generating long after the client left unless ridge closes the upstream
request. Checked on the engine itself: ``vllm:num_requests_running`` is 1 while the client is
there and back to 0 within :data:`STOP_WITHIN_S` seconds after it left.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from itertools import islice

import pytest
from openai import APITimeoutError, AsyncOpenAI, OpenAI

from tests.real_engine.conftest import PLAIN_MODEL, Engines
from tests.real_engine.prompts import user
from tests.real_engine.scrape import poll, running, wait_for
from tests.real_engine.servers import Server

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(600)]

STOP_WITHIN_S = 10.0
LONG_TOKENS = 1500
NO_EOS = {"ignore_eos": True}
STORY = user("Write a very long story about a dragon who learns to cook.")


def _idle(engine: Server) -> None:
    wait_for(lambda: running(engine.url) == 0, timeout_s=STOP_WITHIN_S)


def _seen_running(engine: Server, timeout_s: float = 5.0) -> float:
    return poll(lambda: running(engine.url), lambda r: r >= 1, timeout_s)


def test_stream_closed_by_client_stops_engine(client: OpenAI, engines: Engines) -> None:
    _idle(engines.plain)
    stream = client.chat.completions.create(
        model=PLAIN_MODEL, messages=STORY, stream=True, max_tokens=LONG_TOKENS, temperature=0,
        extra_body=NO_EOS,
    )
    assert len(list(islice(stream, 5))) == 5
    assert _seen_running(engines.plain) == 1
    stream.close()
    took = wait_for(lambda: running(engines.plain.url) == 0, timeout_s=STOP_WITHIN_S)
    print(f"\nengine idle {took:.2f} s after the client closed its stream")


async def test_async_stream_closed_by_client_stops_engine(
    async_client: AsyncOpenAI, engines: Engines
) -> None:
    await asyncio.to_thread(_idle, engines.plain)
    stream = await async_client.chat.completions.create(
        model=PLAIN_MODEL, messages=STORY, stream=True, max_tokens=LONG_TOKENS, temperature=0,
        extra_body=NO_EOS,
    )
    received = 0
    async for _ in stream:
        received += 1
        if received == 5:
            break
    assert await asyncio.to_thread(_seen_running, engines.plain) == 1
    await stream.close()
    took = await asyncio.to_thread(
        wait_for, lambda: running(engines.plain.url) == 0, STOP_WITHIN_S
    )
    print(f"\nengine idle {took:.2f} s after the async client closed its stream")


def test_client_timeout_stops_engine(ridge: Server, engines: Engines) -> None:
    _idle(engines.plain)
    impatient = OpenAI(base_url=ridge.url + "/v1", api_key="unused", max_retries=0, timeout=4.0)
    with impatient, ThreadPoolExecutor(1) as worker:
        call = worker.submit(
            lambda: impatient.chat.completions.create(
                model=PLAIN_MODEL, messages=STORY, max_tokens=LONG_TOKENS, temperature=0,
                extra_body=NO_EOS,
            )
        )
        seen = _seen_running(engines.plain, timeout_s=4.0)
        with pytest.raises(APITimeoutError):
            call.result(timeout=30)
    assert seen == 1, "the request never ran on the engine"
    took = wait_for(lambda: running(engines.plain.url) == 0, timeout_s=STOP_WITHIN_S)
    print(f"\nengine idle {took:.2f} s after the client timed out")
