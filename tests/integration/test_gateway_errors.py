"""Every error ridge answers, over real HTTP: OpenAI-shaped, with the right status."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest

from tests.fakes.engine import FakeEngine
from tests.fakes.harness import (
    RunningRidge,
    closed_port_url,
    fleet_of,
    quick_settings,
    running_ridge,
)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def _post(
    url: str,
    body: bytes | dict[str, Any],
    path: str = "/v1/chat/completions",
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as s:
        kwargs: dict[str, Any] = {"json": body} if isinstance(body, dict) else {"data": body}
        headers = {"content-type": "application/json", **(headers or {})}
        async with s.post(url + path, headers=headers, **kwargs) as r:
            if r.content_type == "text/event-stream":
                return r.status, {"stream": await r.text()}
            return r.status, await r.json(content_type=None)


def _is_openai_error(body: dict[str, Any]) -> bool:
    err = body.get("error")
    return isinstance(err, dict) and set(err) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    ("body", "path", "param"),
    [
        (b"{not json", "/v1/chat/completions", None),
        (b"", "/v1/chat/completions", None),
        (b"[1, 2]", "/v1/chat/completions", None),
        ({"messages": [{"role": "user", "content": "x"}]}, "/v1/chat/completions", "model"),
        ({"model": 3, "messages": []}, "/v1/chat/completions", "model"),
        ({"model": "m"}, "/v1/chat/completions", "messages"),
        ({"model": "m", "messages": "hi"}, "/v1/chat/completions", "messages"),
        (
            {"model": "m", "messages": [{"content": "x"}]},
            "/v1/chat/completions",
            "messages[0].role",
        ),
        ({**CHAT, "stream": "yes"}, "/v1/chat/completions", "stream"),
        ({**CHAT, "max_tokens": "10"}, "/v1/chat/completions", "max_tokens"),
        ({**CHAT, "max_tokens": 0}, "/v1/chat/completions", "max_tokens"),
        (
            {**CHAT, "stream": True, "stream_options": {"include_usage": "y"}},
            "/v1/chat/completions",
            "stream_options.include_usage",
        ),
        ({"model": "m"}, "/v1/completions", "prompt"),
        ({"model": "m", "prompt": {"a": 1}}, "/v1/completions", "prompt"),
    ],
)
async def test_bad_requests_get_400_naming_the_field(
    engines: list[FakeEngine], body: bytes | dict[str, Any], path: str, param: str | None
) -> None:
    async with running_ridge(fleet_of({"p": [engines[0].url]})) as ridge:
        status, reply = await _post(ridge.url, body, path)
    assert status == 400
    assert _is_openai_error(reply)
    assert reply["error"]["type"] == "invalid_request_error"
    assert reply["error"]["param"] == param
    assert engines[0].bodies == []  # nothing reached the engine


async def test_unknown_model_404(engines: list[FakeEngine]) -> None:
    async with running_ridge(fleet_of({"p": [engines[0].url]})) as ridge:
        status, reply = await _post(ridge.url, {**CHAT, "model": "nope"})
    assert status == 404 and _is_openai_error(reply)
    assert reply["error"]["code"] == "model_not_found" and reply["error"]["param"] == "model"


async def test_unknown_route_and_method_are_openai_shaped(engines: list[FakeEngine]) -> None:
    async with (
        running_ridge(fleet_of({"p": [engines[0].url]})) as ridge,
        aiohttp.ClientSession() as s,
    ):
        async with s.get(ridge.url + "/v1/nothing") as r:
            assert r.status == 404 and _is_openai_error(await r.json())
        async with s.get(ridge.url + "/v1/chat/completions") as r:
            assert r.status == 405 and _is_openai_error(await r.json())


async def test_body_over_limit_413(engines: list[FakeEngine]) -> None:
    settings = quick_settings(max_body_bytes=1000)
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 2000}]}
    async with running_ridge(fleet_of({"p": [engines[0].url]}), settings) as ridge:
        status, reply = await _post(ridge.url, big)
        assert status == 413 and _is_openai_error(reply)

        # chunked upload with no content-length is refused the same way
        async def gen() -> AsyncIterator[bytes]:
            for _ in range(20):
                yield b"x" * 100

        async with (
            aiohttp.ClientSession() as s,
            s.post(ridge.url + "/v1/chat/completions", data=gen(),
                   headers={"content-type": "application/json"}) as r,
        ):
            assert r.status == 413 and _is_openai_error(await r.json())
    assert engines[0].bodies == []


async def test_json_posted_as_text_plain_is_a_415(engines: list[FakeEngine]) -> None:
    """What any web page can post to any origin without a preflight is refused."""
    async with (
        running_ridge(fleet_of({"p": [engines[0].url]})) as ridge,
        aiohttp.ClientSession() as s,
        s.post(ridge.url + "/v1/chat/completions", data=json.dumps(CHAT),
               headers={"content-type": "text/plain;charset=UTF-8"}) as r,
    ):
        assert r.status == 415 and _is_openai_error(await r.json())
    assert engines[0].bodies == []


async def test_no_healthy_endpoint_503(engines: list[FakeEngine]) -> None:
    engines[0].mode = "unhealthy"
    fleet = fleet_of({"p": [engines[0].url, closed_port_url()]})
    async with running_ridge(fleet) as ridge:
        status, reply = await _post(ridge.url, CHAT)
        async with aiohttp.ClientSession() as s, s.get(ridge.url + "/ready") as r:
            assert r.status == 503
        async with aiohttp.ClientSession() as s, s.get(ridge.url + "/v1/models") as r:
            assert (await r.json())["data"] == []
    assert status == 503 and _is_openai_error(reply)
    assert reply["error"]["code"] == "no_healthy_endpoint"


async def test_reset_before_first_byte_is_retried_on_another_endpoint(
    engines: list[FakeEngine],
    transport: str,
) -> None:
    engines[0].mode = "reset"
    fleet = fleet_of({"p": [engines[0].url, engines[1].url]})
    async with running_ridge(fleet, quick_settings(upstream={"transport": transport})) as ridge:
        for _ in range(4):
            status, reply = await _post(ridge.url, CHAT)
            assert status == 200, reply
        assert _counter(ridge, "ridge_upstream_retries_total", pool="p") >= 1
    assert engines[1].served == 4


async def test_every_endpoint_failing_gives_502(engines: list[FakeEngine], transport: str) -> None:
    for e in engines:
        e.mode = "reset"
    fleet = fleet_of({"p": [e.url for e in engines]})
    async with running_ridge(fleet, quick_settings(upstream={"transport": transport})) as ridge:
        status, reply = await _post(ridge.url, CHAT)
    assert status == 502 and _is_openai_error(reply)
    assert reply["error"]["code"] == "upstream_unreachable"
    assert len(engines[0].bodies) + len(engines[1].bodies) == 2  # tried once, retried once


async def test_endpoint_killed_before_the_request_is_retried(
    engines: list[FakeEngine], transport: str
) -> None:
    settings = quick_settings(registry={"poll_interval_s": 60.0}, upstream={"transport": transport})
    fleet = fleet_of({"p": [e.url for e in engines]})
    async with running_ridge(fleet, settings) as ridge:
        await engines[0].stop()  # the registry still thinks it healthy: connect is refused
        results = [await _post(ridge.url, CHAT) for _ in range(3)]
        assert [s for s, _ in results] == [200, 200, 200]
        status = ridge.gateway.registry.status(engines[0].url)
        assert not status.healthy


async def test_upstream_timeout_504(engines: list[FakeEngine], transport: str) -> None:
    engines[0].mode, engines[0].delay_s = "slow", 3.0
    settings = quick_settings(upstream={"first_byte_timeout_s": 0.5, "transport": transport})
    async with running_ridge(fleet_of({"p": [engines[0].url]}), settings) as ridge:
        started = time.monotonic()
        status, reply = await _post(ridge.url, CHAT)
        assert time.monotonic() - started < 2.5
    assert status == 504 and _is_openai_error(reply)
    assert reply["error"]["code"] == "upstream_timeout"


async def test_engine_4xx_reaches_the_client_as_written(
    engines: list[FakeEngine], transport: str
) -> None:
    engines[0].mode = "error_400"
    settings = quick_settings(upstream={"transport": transport})
    async with running_ridge(fleet_of({"p": [engines[0].url]}), settings) as ridge:
        status, reply = await _post(ridge.url, CHAT)
        stream_status, stream_reply = await _post(ridge.url, {**CHAT, "stream": True})
    expected = {
        "error": {
            "message": "This model's maximum context length is 2048",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    }
    assert (status, reply) == (400, expected)
    assert (stream_status, stream_reply) == (400, expected)


async def test_endpoint_dying_mid_stream_ends_with_an_error_event(
    engines: list[FakeEngine],
    transport: str,
) -> None:
    engines[0].mode, engines[0].tokens, engines[0].token_interval_s = "die_mid", 20, 0.01
    settings = quick_settings(upstream={"transport": transport})
    async with running_ridge(fleet_of({"p": [engines[0].url]}), settings) as ridge:
        client = openai.AsyncOpenAI(base_url=ridge.url + "/v1", api_key="x", max_retries=0)
        got: list[str] = []
        with pytest.raises(openai.APIError, match="broke off"):
            async with asyncio.timeout(10):
                stream = await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], stream=True
                )
                async for chunk in stream:
                    got.extend(c.delta.content or "" for c in chunk.choices)
        assert "".join(got) == "alpha beta "
        await client.close()
        await _settled(ridge)
        assert _counter(ridge, "ridge_requests_total", model="m", pool="p", status="502") == 1


async def test_no_in_flight_slot_or_task_is_left_behind(engines: list[FakeEngine]) -> None:
    engines[0].mode = "reset"
    fleet = fleet_of({"p": [e.url for e in engines]})
    async with running_ridge(fleet) as ridge:
        before = len(_ridge_tasks())
        bodies: list[bytes | dict[str, Any]] = [CHAT, {**CHAT, "stream": True}, b"{", CHAT]
        await asyncio.gather(*(_post(ridge.url, b) for b in bodies * 5))
        await _settled(ridge)
        assert ridge.gateway.state.in_flight() == {}
        assert ridge.metrics.get_sample_value("ridge_requests_in_flight", {"pool": "p"}) == 0
        leftover = _ridge_tasks()
        assert len(leftover) <= before, leftover


async def _settled(ridge: RunningRidge) -> None:
    for _ in range(50):
        await asyncio.sleep(0.02)
        if not ridge.gateway.state.in_flight():
            return


def _ridge_tasks() -> list[str]:
    """Tasks now alive, except the fake engines' connection handlers (keep-alive
    connections from ridge's shared pool, which are meant to stay)."""
    names = [getattr(t.get_coro(), "__qualname__", "") for t in asyncio.all_tasks()]
    return [n for n in names if not n.startswith("RequestHandler.")]


def _counter(ridge: RunningRidge, name: str, **labels: str) -> float:
    value = ridge.metrics.get_sample_value(name, labels)
    return value or 0.0


@pytest.mark.parametrize("mode", ["empty_200", "cut_200"])
async def test_a_broken_200_is_retried_and_counted_never_a_success(
        engines: list[FakeEngine], mode: str) -> None:
    """An engine that answers 200 with an empty or cut-short body: the client gets the other
    engine's whole answer, the broken one is counted against its endpoint and exported; with
    only broken engines left, a 502, and a stream ends with an error event."""
    engines[0].mode = mode
    async with running_ridge(fleet_of({"p": [engines[0].url, engines[1].url]})) as ridge:
        for _ in range(4):  # whichever engine each goes to first
            status, reply = await _post(ridge.url, CHAT)
            assert status == 200 and reply["choices"][0]["message"]["content"]
        assert engines[1].served == 4
        reason = "empty" if mode == "empty_200" else "cut_short"
        assert _counter(ridge, "ridge_upstream_broken_answers_total", pool="p",
                        reason=reason) >= 1
        assert _counter(ridge, "ridge_requests_total", model="m", pool="p", status="200") == 4
    async with running_ridge(fleet_of({"p": [engines[0].url]})) as ridge:
        status, reply = await _post(ridge.url, CHAT)
        assert status == 502 and reply["error"]["code"] == "upstream_broken"
        for _ in range(100):  # until the poller finds the engine healthy again
            status, reply = await _post(ridge.url, {**CHAT, "stream": True})
            if status != 503:
                break
            await asyncio.sleep(0.1)
        assert status == 200 and '"upstream_broken"' in reply["stream"].rsplit("data: ", 1)[1]
        await _settled(ridge)
        assert _counter(ridge, "ridge_requests_total", model="m", pool="p", status="502") == 2
        assert _counter(ridge, "ridge_upstream_broken_answers_total", pool="p",
                        reason="no_end") == 1
