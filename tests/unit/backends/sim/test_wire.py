"""The simulated endpoint's HTTP routes for vLLM's render API: a vLLM engine answers a chat or
completions request with the token ids it would prefill; an SGLang engine has no such path."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from backends.sim.clock import VirtualClock
from backends.sim.endpoint import SimEndpoint
from backends.sim.pd import KVTransferHub
from backends.sim.wire import build_app
from tests.unit.backends.sim.sim_helpers import make_pool


def endpoint(engine: str) -> SimEndpoint:
    return SimEndpoint(make_pool(engine=engine), 0, 1, VirtualClock(), KVTransferHub(), 0)


async def test_a_vllm_engine_renders_a_request_as_the_ids_it_would_prefill() -> None:
    ep = endpoint("vllm")
    model = ep.info.served[0]
    chat: dict[str, Any] = {"model": model, "max_tokens": 4,
                            "messages": [{"role": "user", "content": "a shared prefix"}]}
    completion = {"model": model, "prompt": "a shared prefix"}
    async with TestClient(TestServer(build_app(ep), host="127.0.0.1")) as client:
        resp = await client.post("/v1/chat/completions/render", json=chat)
        assert resp.status == 200
        rendered = await resp.json()
        resp = await client.post("/v1/completions/render", json=completion)
        assert resp.status == 200
        (one,) = await resp.json()
        refused = await client.post("/v1/chat/completions/render",
                                    json={**chat, "model": "other"})
        assert refused.status == 404 and "error" in await refused.json()
    assert rendered["token_ids"] == list(ep.prompt_ids(ep.parse("chat", chat)))
    assert rendered["request_id"].startswith("chatcmpl-")
    assert rendered["sampling_params"]["max_tokens"] == 4
    assert one["token_ids"] == list(ep.prompt_ids(ep.parse("completion", completion)))
    assert one["request_id"].startswith("cmpl-") and one["token_ids"] != rendered["token_ids"]


async def test_an_sglang_engine_has_no_render_path() -> None:
    ep = endpoint("sglang")
    body = {"messages": [{"role": "user", "content": "x"}]}
    async with TestClient(TestServer(build_app(ep), host="127.0.0.1")) as client:
        resp = await client.post("/v1/chat/completions/render", json=body)
        assert resp.status == 404
