"""ridge over real HTTP with the official openai client, in front of fake engines."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import openai
import pytest

from tests.fakes.engine import FakeEngine
from tests.fakes.harness import RunningRidge, fleet_of, running_ridge


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    fake = FakeEngine(tokens=5)
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def ridge(engine: FakeEngine) -> AsyncIterator[RunningRidge]:
    async with running_ridge(fleet_of({"general": [engine.url]})) as r:
        yield r


async def test_sync_client(ridge: RunningRidge) -> None:
    await asyncio.to_thread(_sync_calls, ridge.url)


def _sync_calls(url: str) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    chat = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert chat.choices[0].message.content == "alpha beta gamma"
    assert chat.usage is not None and chat.usage.completion_tokens == 3
    text = client.completions.create(model="m", prompt="hi", max_tokens=2)
    assert text.choices[0].text == "alpha beta"
    pieces = [
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        if c.choices
    ]
    assert "".join(pieces) == "alpha beta gamma delta epsilon"
    client.close()


async def test_async_client_streams_with_usage(ridge: RunningRidge) -> None:
    client = openai.AsyncOpenAI(base_url=ridge.url + "/v1", api_key="x", max_retries=0)
    stream = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True}, max_tokens=4,
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "alpha beta gamma delta"
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    completion = await client.completions.create(model="m", prompt="x", stream=True, max_tokens=3)
    assert "".join([c.choices[0].text async for c in completion]) == "alpha beta gamma"
    await client.close()


async def test_unread_fields_reach_the_engine_untouched(
    ridge: RunningRidge, engine: FakeEngine
) -> None:
    body = (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], '
            b'"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}], '
            b'"response_format": {"type": "json_object"}, "seed": 7, "logprobs": true,  '
            b'"top_logprobs": 2, "x_custom": [1, 2.50, "\\u00e9"]}')
    client = openai.AsyncOpenAI(base_url=ridge.url + "/v1", api_key="x", max_retries=0)
    raw = await client.post("/chat/completions", body=json.loads(body), cast_to=object)
    assert raw is not None
    sent = engine.bodies[-1]
    assert json.loads(sent) == json.loads(body)
    # and byte for byte when the client's bytes are sent as they are
    import aiohttp

    async with aiohttp.ClientSession() as s, s.post(
        ridge.url + "/v1/chat/completions", data=body,
        headers={"content-type": "application/json"},
    ) as resp:
        assert resp.status == 200
    assert engine.bodies[-1] == body
    await client.close()


async def test_models_health_ready_metrics(ridge: RunningRidge) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as s:
        async with s.get(ridge.url + "/v1/models") as r:
            assert [m["id"] for m in (await r.json())["data"]] == ["m"]
        async with s.get(ridge.url + "/health") as r:
            assert r.status == 200
        async with s.get(ridge.url + "/ready") as r:
            assert r.status == 200
        async with s.post(ridge.url + "/v1/completions",
                          json={"model": "m", "prompt": "p", "stream": True}) as r:
            await r.read()
        async with s.get(ridge.url + "/metrics") as r:
            text = await r.text()
    assert 'ridge_requests_total{model="m",pool="general",status="200"} 1.0' in text
    for name in ("time_to_first_token", "time_per_output_token", "request_duration"):
        assert f'ridge_{name}_seconds_count{{lever="none",model="m",pool="general"}} 1.0' in text
    assert 'ridge_route_decisions_total{lever="none",pool="general",reason="only_pool"} 1.0' in text
