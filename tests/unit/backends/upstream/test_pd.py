"""backends.upstream.pd: what each engine's hand-off sends to the prefill and decode engines."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from backends.upstream.client import UpstreamResponse
from backends.upstream.pd import VllmKvTransfer


class _Answer:
    status = 200
    headers: Mapping[str, str] = {}
    closes_at_once = True

    def __init__(self, body: bytes) -> None:
        self._body = body

    async def read(self, limit: int | None = None) -> bytes:
        return self._body

    async def chunks(self) -> AsyncIterator[bytes]:
        yield self._body

    async def close(self) -> None:
        return None


class _Client:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    async def send(self, url: str, body: bytes, headers: Mapping[str, str]) -> UpstreamResponse:
        self.sent.append((url, json.loads(body)))
        return _Answer(json.dumps({"kv_transfer_params": {"remote_engine_id": "e"}}).encode())

    async def aclose(self) -> None:
        return None


async def test_the_vllm_prefill_is_one_token_and_the_decode_the_clients_request() -> None:
    client = _Client()
    payload = {"model": "m", "max_tokens": 300, "min_tokens": 300, "stream": True,
               "stream_options": {"include_usage": True}, "messages": []}
    await VllmKvTransfer().run(client, "http://p", "http://d", "/v1/chat/completions",
                               payload, {})
    (p_url, prefill), (d_url, decode) = client.sent
    assert (p_url, d_url) == ("http://p/v1/chat/completions", "http://d/v1/chat/completions")
    assert prefill["max_tokens"] == 1 and prefill["stream"] is False
    assert "min_tokens" not in prefill and "stream_options" not in prefill
    assert prefill["kv_transfer_params"]["do_remote_decode"] is True
    assert decode == {**payload, "kv_transfer_params": {"remote_engine_id": "e"}}
