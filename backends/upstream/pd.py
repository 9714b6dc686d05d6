"""The gateway side of prefill/decode disaggregation: one request served by two engines.

Each engine speaks its own hand-off protocol; which one a pool uses is data
(:data:`PD_PROTOCOLS`, keyed by engine), not a branch in the proxy.

- **vLLM** (KV connector, as vLLM's disaggregated-prefill proxy drives it): POST the request to
  the prefill engine with ``max_tokens: 1``, ``stream: false`` and ``kv_transfer_params:
  {"do_remote_decode": true, ...}``; read the ``kv_transfer_params`` of its answer; POST the
  original request plus those params to the decode engine, whose response is the client's.
- **SGLang** (bootstrap rendezvous, as its router drives it): POST the same request, plus
  ``bootstrap_host``, ``bootstrap_port`` and a random 63-bit ``bootstrap_room``, to the prefill
  and the decode engine at once; the decode engine's response is the client's, and the prefill
  call is awaited (or cancelled) in the background of that response.

In both, the request body must be re-encoded (new fields are added), unlike the mixed path,
which forwards the client's bytes untouched.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol
from urllib.parse import urlsplit

from backends.upstream.client import BackendClient, UpstreamConnectError, UpstreamResponse

SGLANG_BOOTSTRAP_PORT = 8998  # SGLang's --disaggregation-bootstrap-port default


@dataclass
class Handoff:
    """A P/D call under way: the decode engine's response, and work to finish with it."""

    response: UpstreamResponse
    prefill_task: asyncio.Task[tuple[int, bytes]] | None = None

    async def close(self) -> None:
        await self.response.close()
        if self.prefill_task is not None and not self.prefill_task.done():
            self.prefill_task.cancel()
        if self.prefill_task is not None:
            await asyncio.gather(self.prefill_task, return_exceptions=True)


class PDProtocol(Protocol):
    async def run(
        self,
        client: BackendClient,
        prefill_url: str,
        decode_url: str,
        path: str,
        payload: dict[str, Any],
        headers: Mapping[str, str],
    ) -> Handoff: ...


class PrefillFailed(UpstreamConnectError):
    """The prefill engine did not hand over: treated like a refused connection (retryable)."""


PREFILL_DROPS = frozenset({"stream_options", "max_completion_tokens", "min_tokens"})
"""What a vLLM prefill request leaves out of the client's: it is one whole token, so a
``min_tokens`` above 1 would be refused (HTTP 400) and a stream has nothing to say."""


class VllmKvTransfer:
    """vLLM: prefill first (max_tokens=1), then decode with the returned kv_transfer_params."""

    async def run(
        self,
        client: BackendClient,
        prefill_url: str,
        decode_url: str,
        path: str,
        payload: dict[str, Any],
        headers: Mapping[str, str],
    ) -> Handoff:
        params = await self._prefill(client, prefill_url + path, payload, headers)
        body = json.dumps({**payload, "kv_transfer_params": params}).encode()
        return Handoff(await client.send(decode_url + path, body, headers))

    async def _prefill(
        self, client: BackendClient, url: str, payload: dict[str, Any], headers: Mapping[str, str]
    ) -> Any:
        request = {k: v for k, v in payload.items() if k not in PREFILL_DROPS}
        request.update(
            max_tokens=1,
            stream=False,
            kv_transfer_params={
                "do_remote_decode": True,
                "do_remote_prefill": False,
                "remote_engine_id": None,
                "remote_block_ids": None,
                "remote_host": None,
                "remote_port": None,
            },
        )
        status, raw = await _whole(client, url, json.dumps(request).encode(), headers)
        if status != 200:
            raise PrefillFailed(f"prefill answered HTTP {status}: {raw[:200]!r}")
        try:
            return json.loads(raw)["kv_transfer_params"]
        except (ValueError, KeyError, TypeError) as exc:
            raise PrefillFailed("prefill answer has no kv_transfer_params") from exc


class SglangBootstrap:
    """SGLang: prefill and decode at once, meeting in a random bootstrap room."""

    def __init__(self, bootstrap_port: int = SGLANG_BOOTSTRAP_PORT) -> None:
        self._port = bootstrap_port

    async def run(
        self,
        client: BackendClient,
        prefill_url: str,
        decode_url: str,
        path: str,
        payload: dict[str, Any],
        headers: Mapping[str, str],
    ) -> Handoff:
        room = secrets.randbits(63)
        host = urlsplit(prefill_url).hostname or "127.0.0.1"
        body = json.dumps(
            {
                **payload,
                "bootstrap_host": host,
                "bootstrap_port": self._port,
                "bootstrap_room": room,
            }
        ).encode()
        prefill = asyncio.ensure_future(_whole(client, prefill_url + path, body, headers))
        try:
            response = await client.send(decode_url + path, body, headers)
        except BaseException:
            prefill.cancel()
            await asyncio.gather(prefill, return_exceptions=True)
            raise
        return Handoff(response, prefill)


async def _whole(client: BackendClient, url: str, body: bytes,
                 headers: Mapping[str, str]) -> tuple[int, bytes]:
    """POST ``body`` and read the whole answer: (status, body)."""
    response = await client.send(url, body, headers)
    try:
        return response.status, await response.read()
    finally:
        await response.close()


PD_PROTOCOLS: Mapping[str, PDProtocol] = MappingProxyType(
    {
        "vllm": VllmKvTransfer(),
        "sglang": SglangBootstrap(),
    }
)
