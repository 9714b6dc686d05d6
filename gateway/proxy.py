"""Serve one parsed request: dispatch it, relay the engine's answer, record what happened.

The dispatcher (:mod:`gateway.dispatch`) routes and sends; this module turns the engine's
response into the client's: a whole body as the engine wrote it, or a stream relayed event by
event as it arrives (a stream that breaks off ends with an OpenAI-shaped error event). ridge
always asks a streaming engine for its usage chunk, to count tokens, and strips that chunk
from the relay when the client did not ask for it. When the client goes away, the upstream
request is closed so the engine stops generating. Every request, however it ends, releases
its reservations and is recorded once.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from backends.client import UpstreamStreamError
from gateway.dispatch import SESSION_HEADER, Attempts, Dispatched, Dispatcher
from gateway.errors import GatewayError
from gateway.openai_request import ParsedRequest
from gateway.slos import SLO_CLASS_HEADER
from gateway.sse import EventSplitter, StreamObserver, error_event
from gateway.telemetry import NO_POOL, RequestRecord, Telemetry

CLIENT_CLOSED = 499  # nginx's convention for "client closed the request"
T = TypeVar("T")


@dataclass
class Call:
    """One request on its way: what was sent where, and what was measured."""

    parsed: ParsedRequest
    started: float
    session_hint: str | None = None
    slo_class: str | None = None
    sent: Dispatched | None = None
    status: int = 0
    ttft_s: float | None = None
    usage: dict[str, Any] | None = None
    completion_tokens: int | None = None
    itl_s: tuple[float, ...] = ()
    completed: bool = False
    closed: bool = field(default=False)

    @property
    def pool(self) -> str:
        return self.sent.plan.decision.pool if self.sent else NO_POOL


class Proxy:
    """Serves requests through the dispatcher; one per app."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        telemetry: Telemetry,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._dispatcher = dispatcher
        self._telemetry = telemetry
        self._clock = clock

    async def handle(self, parsed: ParsedRequest, request: Request) -> Response:
        call = Call(
            _ask_for_usage(parsed),
            self._clock(),
            request.headers.get(SESSION_HEADER),
            request.headers.get(SLO_CLASS_HEADER),
        )
        try:
            sent = await _unless_disconnected(request, self._dispatch(call))
            if sent is None:
                return await self._client_gone(call)
            if call.status == 200 and parsed.stream:
                return self._stream(call, client_wants_usage=parsed.include_usage)
            body = await _unless_disconnected(request, self._read(call))
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

    async def _dispatch(self, call: Call) -> Dispatched:
        attempts = Attempts()
        try:
            call.sent = await self._dispatcher.dispatch(call.parsed, call.session_hint, attempts)
        finally:
            if attempts.failures:
                self._telemetry.retries.labels(call.pool).inc(attempts.failures)
        call.status = call.sent.response.status
        self._telemetry.route(call.sent.plan)
        return call.sent

    async def _read(self, call: Call) -> bytes:
        assert call.sent is not None
        try:
            body = await call.sent.response.read()
        except UpstreamStreamError as exc:
            raise GatewayError(
                502, f"the engine's response broke off: {exc}", code="upstream_broken"
            ) from exc
        if call.status == 200:
            call.usage = _usage_dict(body)
        return body

    async def _whole(self, call: Call, body: bytes) -> Response:
        assert call.sent is not None
        headers = _route_headers(call.sent)
        media = call.sent.response.headers.get("content-type", "application/json")
        call.completed = True
        await self._finish(call)
        return Response(body, status_code=call.status, media_type=media, headers=headers)

    def _stream(self, call: Call, client_wants_usage: bool) -> Response:
        assert call.sent is not None
        return RelayResponse(
            self._relay(call, client_wants_usage),
            on_close=lambda: self._stream_closed(call),
            status_code=200,
            media_type="text/event-stream",
            headers=_route_headers(call.sent),
        )

    async def _relay(self, call: Call, client_wants_usage: bool) -> AsyncIterator[bytes]:
        assert call.sent is not None
        splitter, observer = EventSplitter(), StreamObserver(self._clock)
        try:
            async for chunk in call.sent.response.chunks():
                for event in splitter.feed(chunk):
                    if observer.observe(event) and not client_wants_usage:
                        continue  # the usage chunk ridge asked for on its own account
                    yield event
            if rest := splitter.rest():
                yield rest
            call.completed = True
        except UpstreamStreamError as exc:
            call.status = 502
            yield error_event(
                f"the engine's stream broke off: {exc}", "bad_gateway", "upstream_broken"
            )
        finally:
            if observer.first_token_at is not None:
                call.ttft_s = observer.first_token_at - call.started
            call.usage = observer.usage
            call.completion_tokens = observer.completion_tokens
            call.itl_s = tuple(observer.gaps)

    async def _stream_closed(self, call: Call) -> None:
        if call.status == 200 and not call.completed:
            call.status = CLIENT_CLOSED  # the client left before the end of the stream
        await self._finish(call)

    async def _client_gone(self, call: Call) -> Response:
        call.status = CLIENT_CLOSED
        await self._finish(call)
        return Response(status_code=CLIENT_CLOSED)

    async def _finish(self, call: Call) -> None:
        """Close the upstream, release the reservations and record the request, once."""
        if call.closed:
            return
        call.closed = True
        usage = call.usage or {}
        prompt_tokens = _int(usage.get("prompt_tokens"))
        completion = _int(usage.get("completion_tokens")) or call.completion_tokens
        if call.sent is not None:
            await self._dispatcher.finish(
                call.sent,
                call.parsed,
                succeeded=call.status == 200 and call.completed,
                output_tokens=completion,
                prompt_tokens=prompt_tokens,
            )
        self._telemetry.record(self._record(call, prompt_tokens, completion))

    def _record(
        self, call: Call, prompt_tokens: int | None, completion: int | None
    ) -> RequestRecord:
        sent = call.sent
        details = (call.usage or {}).get("prompt_tokens_details") or {}
        return RequestRecord(
            model=call.parsed.model,
            pool=call.pool,
            status=call.status or CLIENT_CLOSED,
            e2e_s=self._clock() - call.started,
            ttft_s=call.ttft_s,
            completion_tokens=completion,
            lever=sent.plan.decision.lever if sent else None,
            endpoint=(sent.plan.prefill or sent.plan.endpoint).url if sent else None,
            decode_endpoint=sent.plan.endpoint.url if sent and sent.plan.prefill else None,
            prompt_tokens=prompt_tokens,
            cached_tokens=_int(details.get("cached_tokens")) if isinstance(details, dict) else None,
            itl_s=call.itl_s,
            max_tokens=call.parsed.max_tokens,
            slo_class=call.slo_class,
        )


class RelayResponse(StreamingResponse):
    """A streaming response that runs ``on_close`` however the stream ends (done, failed, or
    the client went away), so the upstream is closed and the request recorded at once."""

    def __init__(
        self, content: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]], **kwargs: Any
    ) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await asyncio.shield(self._on_close())


def _ask_for_usage(parsed: ParsedRequest) -> ParsedRequest:
    """A streaming request that does not ask for usage is sent asking for it (ridge counts
    tokens from it); every other request goes as the client sent it, byte for byte."""
    if not parsed.stream or parsed.include_usage:
        return parsed
    options = dict(parsed.payload.get("stream_options") or {})
    options["include_usage"] = True
    payload = {**parsed.payload, "stream_options": options}
    return replace(parsed, payload=payload, body=json.dumps(payload).encode())


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


def _route_headers(sent: Dispatched) -> dict[str, str]:
    """The route decision, and which endpoint of its pool answered (its index in the pool's
    configured list: an engine's address is not the client's business)."""
    return {"x-ridge-route": sent.plan.decision.header_value(),
            "x-ridge-endpoint": str(sent.endpoint_index)}


def _usage_dict(body: bytes) -> dict[str, Any] | None:
    try:
        usage = json.loads(body).get("usage")
    except (ValueError, AttributeError):
        return None
    return usage if isinstance(usage, dict) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
