"""Forward one parsed request to an engine and relay its answer.

Order of events: choose the least-loaded healthy endpoint serving the model (no pool serves
it: 404; none healthy: 503); POST the client's bytes unchanged; if the engine refuses or resets
before the first response byte, mark it failed and retry on another endpoint of the pool
(``retries`` times, then 502); no headers within the first-byte timeout: 504. Streams are
relayed event by event as they arrive; a stream that breaks off ends with an OpenAI-shaped
error event. When the client goes away, the upstream request is closed so the engine stops
generating. Every request, whatever its end, releases its in-flight slot and is recorded once.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, TypeVar

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from backends.client import (
    BackendClient,
    UpstreamConnectError,
    UpstreamResponse,
    UpstreamStreamError,
    UpstreamTimeout,
)
from gateway.errors import GatewayError
from gateway.openai_request import ParsedRequest
from gateway.sse import EventSplitter, StreamObserver, error_event
from gateway.telemetry import NO_POOL, RequestRecord, Telemetry
from routing.least_load import candidates, pick_least_loaded
from routing.types import EndpointSnapshot, PoolSnapshot

CLIENT_CLOSED = 499  # nginx's convention for "client closed the request"
T = TypeVar("T")


class EndpointBook(Protocol):
    """What the proxy needs of the endpoint registry."""

    def snapshot(self) -> tuple[PoolSnapshot, ...]: ...

    def acquire(self, url: str) -> None: ...

    def release(self, url: str) -> None: ...

    def mark_failed(self, url: str, reason: str) -> None: ...


@dataclass
class Call:
    """One request on its way: where it went and what was measured."""

    parsed: ParsedRequest
    started: float
    endpoint: EndpointSnapshot | None = None
    response: UpstreamResponse | None = None
    status: int = 0
    ttft_s: float | None = None
    completion_tokens: int | None = None
    last_error: str | None = None
    completed: bool = False
    closed: bool = field(default=False)

    @property
    def pool(self) -> str:
        return self.endpoint.pool if self.endpoint else NO_POOL


class Proxy:
    """Routes and forwards requests; one per app."""

    def __init__(
        self,
        book: EndpointBook,
        client: BackendClient,
        telemetry: Telemetry,
        retries: int,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._book = book
        self._client = client
        self._telemetry = telemetry
        self._retries = retries
        self._clock = clock

    async def handle(self, parsed: ParsedRequest, request: Request) -> Response:
        call = Call(parsed, self._clock())
        try:
            if parsed.stream:
                opened = await _unless_disconnected(request, self._open(call))
                if opened is None:
                    return await self._client_gone(call)
                if call.status == 200:
                    return self._stream(call)
                body = await _unless_disconnected(request, self._read(call))
            else:
                body = await _unless_disconnected(request, self._open_and_read(call))
            if body is None:
                return await self._client_gone(call)
            return await self._whole(call, body)
        except GatewayError as exc:
            call.status = exc.status
            await self._finish(call)
            raise
        except asyncio.CancelledError:
            call.status = CLIENT_CLOSED
            await self._finish(call)
            raise
        except Exception:
            call.status = 500
            await self._finish(call)
            raise

    async def _open_and_read(self, call: Call) -> bytes:
        await self._open(call)
        return await self._read(call)

    async def _open(self, call: Call) -> bool:
        """Connect to an endpoint and get its response headers, retrying elsewhere if refused."""
        pools = self._book.snapshot()
        model = call.parsed.model
        if not any(p.serves(model) for p in pools):
            raise GatewayError(404, f"The model '{model}' does not exist", param="model",
                               code="model_not_found")
        tried: set[str] = set()
        for _ in range(1 + self._retries):
            endpoint = pick_least_loaded(candidates(pools, model), frozenset(tried))
            if endpoint is None:
                break
            if await self._try(call, endpoint, tried):
                return True
            pools = self._book.snapshot()
        if not tried:
            raise GatewayError(503, f"no healthy endpoint serves the model '{model}'",
                               code="no_healthy_endpoint")
        raise GatewayError(
            502, f"upstream unreachable after {len(tried)} attempt(s): {call.last_error}",
            code="upstream_unreachable",
        )

    async def _try(self, call: Call, endpoint: EndpointSnapshot, tried: set[str]) -> bool:
        """One attempt on ``endpoint``; True when its response headers arrived."""
        url = endpoint.url
        if tried:
            self._telemetry.retries.labels(endpoint.pool).inc()
        tried.add(url)
        self._hold(endpoint)
        call.endpoint = endpoint
        try:
            call.response = await self._client.send(
                url + call.parsed.endpoint.value, call.parsed.body, _FORWARD_HEADERS
            )
        except UpstreamConnectError as exc:
            self._free(endpoint)
            self._book.mark_failed(url, str(exc))
            call.endpoint = None
            call.last_error = str(exc)
            return False
        except UpstreamTimeout as exc:
            raise GatewayError(504, f"the engine did not answer in time: {exc}",
                               code="upstream_timeout") from exc
        except BaseException:
            self._free(endpoint)
            call.endpoint = None
            raise
        call.status = call.response.status
        return True

    def _hold(self, endpoint: EndpointSnapshot) -> None:
        self._book.acquire(endpoint.url)
        self._telemetry.in_flight.labels(endpoint.pool).inc()

    def _free(self, endpoint: EndpointSnapshot) -> None:
        self._book.release(endpoint.url)
        self._telemetry.in_flight.labels(endpoint.pool).dec()

    async def _read(self, call: Call) -> bytes:
        assert call.response is not None
        try:
            body = await call.response.read()
        except UpstreamStreamError as exc:
            raise GatewayError(502, f"the engine's response broke off: {exc}",
                               code="upstream_broken") from exc
        call.completion_tokens = _usage_tokens(body) if call.status == 200 else None
        return body

    async def _whole(self, call: Call, body: bytes) -> Response:
        assert call.response is not None
        headers = _route_headers(call)
        media = call.response.headers.get("content-type", "application/json")
        await self._finish(call)
        return Response(body, status_code=call.status, media_type=media, headers=headers)

    def _stream(self, call: Call) -> Response:
        return RelayResponse(
            self._relay(call),
            on_close=lambda: self._stream_closed(call),
            status_code=200,
            media_type="text/event-stream",
            headers=_route_headers(call),
        )

    async def _relay(self, call: Call) -> AsyncIterator[bytes]:
        assert call.response is not None
        splitter, observer = EventSplitter(), StreamObserver(self._clock)
        try:
            async for chunk in call.response.chunks():
                for event in splitter.feed(chunk):
                    observer.observe(event)
                    yield event
            if rest := splitter.rest():
                yield rest
            call.completed = True
        except UpstreamStreamError as exc:
            call.status = 502
            yield error_event(f"the engine's stream broke off: {exc}", "bad_gateway",
                              "upstream_broken")
        finally:
            if observer.first_token_at is not None:
                call.ttft_s = observer.first_token_at - call.started
            call.completion_tokens = observer.completion_tokens

    async def _stream_closed(self, call: Call) -> None:
        if call.status == 200 and not call.completed:
            call.status = CLIENT_CLOSED  # the client left before the end of the stream
        await self._finish(call)

    async def _client_gone(self, call: Call) -> Response:
        call.status = CLIENT_CLOSED
        await self._finish(call)
        return Response(status_code=CLIENT_CLOSED)

    async def _finish(self, call: Call) -> None:
        """Close the upstream, free the slot and record the request, exactly once."""
        if call.closed:
            return
        call.closed = True
        if call.response is not None:
            await call.response.close()
        if call.endpoint is not None:
            self._free(call.endpoint)
        self._telemetry.record(RequestRecord(
            model=call.parsed.model, pool=call.pool, status=call.status or CLIENT_CLOSED,
            e2e_s=self._clock() - call.started, ttft_s=call.ttft_s,
            completion_tokens=call.completion_tokens,
        ))


_FORWARD_HEADERS = MappingProxyType({"content-type": "application/json", "accept": "*/*"})


class RelayResponse(StreamingResponse):
    """A streaming response that runs ``on_close`` however the stream ends (done, failed, or
    the client went away), so the upstream is closed and the request recorded at once."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        on_close: Callable[[], Awaitable[None]],
        **kwargs: Any,
    ) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await asyncio.shield(self._on_close())


async def _unless_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T | None:
    """Run ``work`` unless the client disconnects first (then cancel it and return None)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)
    if task.cancelled():
        return None
    return task.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _route_headers(call: Call) -> dict[str, str]:
    assert call.endpoint is not None
    return {"x-ridge-route": f"pool={call.endpoint.pool}; reason=least_load"}


def _usage_tokens(body: bytes) -> int | None:
    try:
        usage = json.loads(body).get("usage") or {}
    except (ValueError, AttributeError):
        return None
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) else None
