"""A controllable fake OpenAI engine for the gateway's HTTP tests.

It answers like vLLM (chat and completions, JSON or SSE with role, content, finish and usage
chunks, then ``[DONE]``; ``/health``; a ``/metrics`` page with ``vllm:num_requests_running``),
and can misbehave on demand through ``FakeEngine.mode``:

- ``ok``            answer normally;
- ``reset``         close the connection before sending anything;
- ``die_mid``       stream ``die_after`` content chunks, then cut the connection;
- ``slow``          wait ``delay_s`` before the response headers;
- ``error_400``     answer a vLLM-style 400 error;
- ``unhealthy``     ``/health`` answers 503;
- ``garbage``       answer bytes that are not HTTP, then close;
- ``status_999``    answer an HTTP/1.1 response with the status 999, then close;
- ``huge``          answer ``huge_bytes`` bytes: a JSON body, or (streamed) one event that
                    never ends;
- ``empty_200``     answer 200 with an empty body (streamed: no event at all);
- ``cut_200``       answer 200 with a body cut short but whole as HTTP (streamed: every event
                    but the usage and ``[DONE]``, then a clean end).

With ``api_key`` set, a generation request without ``Authorization: Bearer <api_key>`` gets
vLLM's 401 (``{"error": "Unauthorized"}``), as an engine started with ``--api-key`` answers.

``running`` counts requests being generated now; a request whose client goes away is aborted
(the handler is cancelled, as vLLM aborts it), which tests observe through ``running``. With
``kv_per_request`` set, ``/metrics`` also says the KV cache is ``running × kv_per_request`` used
(``vllm:kv_cache_usage_perc``, at most 1).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

_RAW = {"garbage": b"this is not HTTP at all\r\n\r\n",
        "status_999": b"HTTP/1.1 999 Odd\r\ncontent-length: 2\r\n\r\n{}"}
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")


@dataclass
class FakeEngine:
    model: str = "m"
    tokens: int = 5
    token_interval_s: float = 0.0
    mode: str = "ok"
    die_after: int = 2
    delay_s: float = 0.0
    huge_bytes: int = 0
    api_key: str | None = None
    kv_per_request: float | None = None
    running: int = 0
    served: int = 0
    bodies: list[bytes] = field(default_factory=list)
    _runner: web.AppRunner | None = None
    url: str = ""

    async def start(self, port: int = 0) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(status=503 if self.mode == "unhealthy" else 200)

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        )

    async def _metrics(self, _: web.Request) -> web.Response:
        text = (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0",model_name="{self.model}"}} {self.running}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{engine="0",model_name="{self.model}"}} 0\n'
        )
        if self.kv_per_request is not None:
            usage = min(1.0, self.running * self.kv_per_request)
            text += ("# TYPE vllm:kv_cache_usage_perc gauge\n"
                     f'vllm:kv_cache_usage_perc{{engine="0",model_name="{self.model}"}} {usage}\n')
        return web.Response(text=text, content_type="text/plain")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        body = await request.read()
        self.bodies.append(body)
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": "Unauthorized"}, status=401)  # as vLLM answers
        if self.mode in ("reset", "garbage", "status_999"):
            assert request.transport is not None
            request.transport.write(_RAW.get(self.mode, b""))
            request.transport.abort()
            raise asyncio.CancelledError
        if self.mode == "error_400":
            return web.json_response(
                _vllm_error("This model's maximum context length is 2048"), status=400
            )
        payload = json.loads(body)
        if payload.get("model") != self.model:
            return web.json_response(
                _vllm_error(f"The model `{payload.get('model')}` does not exist.", 404), status=404
            )
        if self.mode == "slow":
            await asyncio.sleep(self.delay_s)
        if self.mode == "huge":
            return await self._huge(request, bool(payload.get("stream")))
        if self.mode == "empty_200":
            kind = "text/event-stream" if payload.get("stream") else "application/json"
            return web.Response(body=b"", headers={"content-type": kind})
        self.running += 1
        try:
            if payload.get("stream"):
                return await self._stream(request, payload, chat)
            whole = await self._whole(payload, chat)
            if self.mode == "cut_200":
                assert isinstance(whole.body, bytes)
                return web.Response(body=whole.body[:len(whole.body) // 2],
                                    headers={"content-type": "application/json"})
            return whole
        finally:
            self.running -= 1

    async def _huge(self, request: web.Request, stream: bool) -> web.StreamResponse:
        kind = "text/event-stream" if stream else "application/json"
        resp = web.StreamResponse(headers={"content-type": kind})
        await resp.prepare(request)
        await resp.write(b'data: {"x": "' if stream else b'{"x": "')
        for _ in range(self.huge_bytes // 65536):
            await resp.write(b"x" * 65536)
        await resp.write(b"" if stream else b'"}')
        return resp

    def _n(self, payload: dict[str, Any]) -> int:
        return int(payload.get("max_tokens") or self.tokens)

    async def _whole(self, payload: dict[str, Any], chat: bool) -> web.Response:
        n = self._n(payload)
        await asyncio.sleep(self.token_interval_s * n)
        text = " ".join(WORDS[i % len(WORDS)] for i in range(n))
        choice: dict[str, Any] = (
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "length",
            }
            if chat
            else {"index": 0, "text": text, "finish_reason": "length"}
        )
        self.served += 1
        return web.json_response(
            {
                "id": "cmpl-fake",
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [choice],
                "usage": {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n},
            }
        )

    async def _stream(
        self, request: web.Request, payload: dict[str, Any], chat: bool
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        n = self._n(payload)
        if chat:
            await resp.write(_event(_chunk(self.model, chat, {"role": "assistant", "content": ""})))
        for i in range(n):
            if self.mode == "die_mid" and i == self.die_after:
                assert request.transport is not None
                request.transport.abort()
                return resp
            await asyncio.sleep(self.token_interval_s)
            word = WORDS[i % len(WORDS)] + ("" if i == n - 1 else " ")
            await resp.write(_event(_chunk(self.model, chat, {"content": word} if chat else word)))
        await resp.write(_event(_chunk(self.model, chat, {} if chat else "", "length")))
        if self.mode == "cut_200":
            return resp
        if (payload.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}
            await resp.write(
                _event(
                    {
                        "id": "cmpl-fake",
                        "object": "chat.completion.chunk",
                        "created": 0,
                        "model": self.model,
                        "choices": [],
                        "usage": usage,
                    }
                )
            )
        await resp.write(b"data: [DONE]\n\n")
        self.served += 1
        return resp


def _chunk(model: str, chat: bool, piece: Any, finish: str | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = (
        {"index": 0, "delta": piece, "logprobs": None, "finish_reason": finish}
        if chat
        else {"index": 0, "text": piece, "logprobs": None, "finish_reason": finish}
    )
    return {
        "id": "cmpl-fake",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": 0,
        "model": model,
        "choices": [choice],
    }


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def _vllm_error(message: str, code: int = 400) -> dict[str, Any]:
    kind = "BadRequestError" if code == 400 else "NotFoundError"
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
