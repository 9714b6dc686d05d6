"""Serve one request for an engine: read, parse, dispatch, relay, record.

The engine routes (:data:`PROXIED_PATHS`: chat and completions, the hot path, and Responses,
embeddings, score, rerank, tokenize, detokenize) reach :class:`Proxy` through the front door
(:attr:`Proxy.doors`, :mod:`gateway.server.front_door`) on ridge's own protocol, else from
:class:`gateway.app.RidgeApp` as ASGI, skipping FastAPI's routing, dependency injection and
middleware either way; both as an :class:`~gateway.server.exchange.Exchange`. It reads the
body (413 past :class:`BodyLimits`), parses the few fields ridge needs
(:mod:`gateway.request.body`), dispatches (:mod:`gateway.request.dispatch`) and relays the
answer: whole, or a stream as it arrives (:mod:`gateway.request.sse`,
:mod:`gateway.request.responses_sse`), from the engine connection's callback where ridge's
protocol and client allow it (:meth:`Proxy._relay`).

Invariants: every request, however it ends, releases its reservations and is recorded once
(499 when the client went away: :func:`watch_disconnect`); every response carries
``x-request-id``; an error ridge answers is OpenAI-shaped and names no engine address.
See docs/gateway.md#the-proxy.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from starlette.types import Receive, Scope, Send

from backends.upstream.client import Relaying, UpstreamStreamError, relaying
from gateway.access.control import Access
from gateway.access.keys import ANONYMOUS, Caller
from gateway.access.limits import Grant
from gateway.request.answers import NO_END, broken_whole
from gateway.request.body import (
    NO_INFERENCE,
    SCAN_JSON,
    ApiPath,
    ParsedRequest,
    parse_request,
)
from gateway.request.deadline import within
from gateway.request.dispatch import AdmissionControl, Attempts, Dispatched
from gateway.request.responses_sse import ResponsesScanner, chat_usage
from gateway.request.sse import MAX_EVENT_BYTES, StreamScanner, error_event
from gateway.server.errors import GatewayError
from gateway.server.exchange import (
    JSON_TYPE,
    REQUEST_ID_HEADER,
    AsgiExchange,
    BodyWriter,
    ClientGone,
    Exchange,
    Headers,
    error_response,
)
from gateway.server.front_door import Door
from gateway.server.protocol import body_writer
from gateway.telemetry.access_log import AccessLog
from gateway.telemetry.prometheus import NO_POOL, RequestRecord, Telemetry
from gateway.telemetry.trace import TraceRecorder
from routing.router import RoutePlan

log = logging.getLogger("ridge")

CLIENT_CLOSED = 499  # nginx's convention for "client closed the request"
PROXIED_PATHS: Mapping[str, ApiPath] = MappingProxyType(
    {api_path.value: api_path for api_path in ApiPath})
"""Every path the proxy serves (``POST`` only), by the API it is."""
_RESPONSES = ApiPath.RESPONSES
_COMPLETIONS = ApiPath.COMPLETIONS
SESSION_HEADER = b"x-session-id"
SLO_CLASS_HEADER = b"x-ridge-slo-class"
AUTHORIZATION = b"authorization"
CONTENT_TYPE = b"content-type"
_READ = frozenset((b"content-length", SESSION_HEADER, SLO_CLASS_HEADER, REQUEST_ID_HEADER,
                   AUTHORIZATION, CONTENT_TYPE))
_REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,128}")


class Call:
    """One request on its way: what was sent where, and what was measured. A plain class, not
    a dataclass: compiled, made with no call into the interpreter (one per request)."""

    __slots__ = ("started", "parsed", "session_hint", "slo_class", "sent", "plan", "status",
                 "response_started", "completed", "ttft_s", "ttfb_s", "usage",
                 "completion_tokens", "itl_s", "client_gone", "request_id", "caller", "grant",
                 "refused_by", "path")

    def __init__(self, started: float, path: str = "") -> None:
        self.started = started
        self.path = path
        self.parsed: ParsedRequest | None = None
        self.session_hint: str | None = None
        self.slo_class: str | None = None
        self.sent: Dispatched | None = None
        self.plan: RoutePlan | None = None
        self.status = 0
        self.response_started = False
        self.completed = False
        self.ttft_s: float | None = None
        self.ttfb_s: float | None = None
        self.usage: dict[str, Any] | None = None
        self.completion_tokens: int | None = None
        self.itl_s: tuple[float, ...] = ()
        self.client_gone = False
        self.request_id = b""
        self.caller: Caller = ANONYMOUS
        self.grant: Grant | None = None
        self.refused_by: str | None = None

    @property
    def pool(self) -> str:
        """The pool the request was routed to (the last one tried, when it failed before any
        engine's headers), else the pool whose admission control refused it; ``none`` when
        neither."""
        if self.plan is not None:
            return self.plan.decision.pool
        return self.refused_by if self.refused_by is not None else NO_POOL


class Dispatch(Protocol):
    """What the proxy needs of the dispatcher (:class:`gateway.request.dispatch.Dispatcher`)."""

    @property
    def admission(self) -> AdmissionControl | None: ...

    async def dispatch(self, parsed: ParsedRequest, session_hint: str | None,
                       attempts: Attempts, *, key: str | None = None,
                       slo_class: str | None = None) -> Dispatched: ...

    def may_retry(self, attempts: Attempts) -> bool: ...

    def answer_broken(self, sent: Dispatched, attempts: Attempts, why: str) -> None: ...

    def engine_failed(self, sent: Dispatched, why: str) -> None: ...

    def first_token(self, sent: Dispatched, ttft_s: float) -> None: ...

    async def finish(self, sent: Dispatched, parsed: ParsedRequest, *, succeeded: bool,
                     output_tokens: int | None, prompt_tokens: int | None) -> None: ...


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """Sizes [bytes]: a client's request body (413 past it); an engine's whole answer and one
    event of its stream (502 past them, and its endpoint counted as failing)."""

    request: int = 4 * 1024 * 1024
    response: int = 64 * 1024 * 1024
    event: int = MAX_EVENT_BYTES


class Proxy:
    """The handler of the generation routes, for the front door (:attr:`doors`) and as an
    ASGI application; one per app."""

    def __init__(self, dispatcher: Dispatch, telemetry: Telemetry, access: Access,
                 limits: BodyLimits = BodyLimits(),
                 clock: Callable[[], float] = time.perf_counter,
                 trace: TraceRecorder | None = None,
                 access_log: AccessLog | None = None) -> None:
        self._trace = trace  # traffic recording (gateway.telemetry.trace); None: off
        self._access_log = access_log  # one line per request; None: off
        self._dispatcher = dispatcher
        self._telemetry = telemetry
        self._access = access
        self._limits = limits
        self._clock = clock
        self._ids = itertools.count(1)
        self._id_prefix = os.urandom(4).hex()
        self.doors: Mapping[bytes, Door] = MappingProxyType({
            path.encode(): Door(functools.partial(self.serve, api_path=api_path), limits.request)
            for path, api_path in PROXIED_PATHS.items()})
        """The front door of each path this proxy serves (:mod:`gateway.server.front_door`)."""

    @property
    def dispatcher(self) -> Dispatch:
        return self._dispatcher

    async def __call__(self, scope: Scope, receive: Receive, send: Send,
                       api_path: ApiPath) -> None:
        """Serve a request an ASGI server carries."""
        await self.serve(AsgiExchange(scope, receive, send, body_writer), api_path)

    async def serve(self, exchange: Exchange, api_path: ApiPath) -> None:
        """Serve one request for an engine, however it ends (module docstring)."""
        call = Call(self._clock(), path=api_path)  # a StrEnum: its own path
        headers = _read_headers(exchange.headers, call)
        call.request_id = _client_request_id(headers.get(REQUEST_ID_HEADER)) or \
            f"req-{self._id_prefix}{next(self._ids):x}".encode()
        # Finished after the ``try``, not in a ``finally``: compiled, an await in a ``finally``
        # revives a cancellation handled in _answer (docs/gateway.md#compiled-modules).
        try:
            await self._answer(call, exchange, api_path, headers)
        except BaseException:
            await self._finish(call)
            raise
        await self._finish(call)

    async def _answer(self, call: Call, exchange: Exchange, api_path: ApiPath,
                      headers: dict[bytes, bytes]) -> None:
        """Authenticate, admit and serve the request; every refusal or failure answered."""
        stop_watching: Callable[[], None] = _nothing
        try:
            call.caller = self._access.authenticate(headers.get(AUTHORIZATION))
            check_content_type(headers.get(CONTENT_TYPE))
            body = await exchange.body(self._limits.request)
            call.parsed = _ask_for_usage(parse_request(api_path, body))
            if call.caller.record is not None:  # anonymous callers have nothing to admit
                call.grant = await self._access.admit(call.caller, call.parsed)
            stop_watching = watch_disconnect(exchange, call)
            await self._serve_within(call, exchange, self._access.deadline_s(call.caller))
        except GatewayError as exc:
            call.status, call.refused_by = exc.status, exc.pool
            if exc.detail is not None:
                log.warning("request %s: %s (%s)", call.request_id.decode(), exc.message,
                            exc.detail)
            await self._send_error(call, exchange, exc)
        except ClientGone:
            call.status, call.client_gone = CLIENT_CLOSED, True
        except asyncio.CancelledError:
            call.status = CLIENT_CLOSED
            if not call.client_gone:
                raise  # not the client's doing (the server is stopping): pass it on
            _uncancel()  # the client's leaving is handled here, not a cancellation to pass on
        except Exception:
            log.exception("request %s failed", call.request_id.decode())
            call.status = 500
            await self._send_error(call, exchange, GatewayError(500, "internal error",
                                                                code="internal_error"))
        finally:
            stop_watching()

    async def _serve_within(self, call: Call, exchange: Exchange,
                            deadline_s: float | None) -> None:
        """Serve the request, within its deadline when it has one: past it, a 504 — or, once
        a stream has started, an error event that ends it."""
        if deadline_s is None:
            await self._serve(call, exchange)
            return
        if not await within(deadline_s, self._serve(call, exchange)):
            if not call.response_started:
                raise GatewayError(504, f"the request took longer than its deadline of "
                                   f"{deadline_s:g} s", code="request_timeout") from None
            call.status = 504
            await exchange.send(error_event("the request took longer than its deadline",
                                            "timeout", "request_timeout"), more=False)

    async def _serve(self, call: Call, exchange: Exchange) -> None:
        """Dispatch and relay; a whole 200 answer that is broken (:mod:`gateway.request.answers`)
        reached no one yet, so it is sent elsewhere while retries remain, else a 502."""
        assert call.parsed is not None
        attempts = Attempts()
        try:
            while True:
                sent = await self._dispatch(call, attempts)
                call.status = sent.response.status
                if call.status == 200 and call.parsed.stream:
                    await self._stream(call, exchange)
                    return
                if call.status == 200:  # the engine's headers are in: its first byte
                    call.ttfb_s = self._clock() - call.started
                body = await self._read(call)
                why = broken_whole(call.parsed.api_path, body) if call.status == 200 else None
                if why is None:
                    await self._whole(call, exchange, body)
                    return
                await self._broken(call, attempts, why)
        finally:
            if attempts.failures:
                self._telemetry.retries_of(call.pool).inc(attempts.failures)

    async def _dispatch(self, call: Call, attempts: Attempts) -> Dispatched:
        """One dispatch of the request, its route decision counted."""
        assert call.parsed is not None
        try:
            call.sent = await self._dispatcher.dispatch(
                call.parsed, call.session_hint, attempts, key=call.caller.name,
                slo_class=call.slo_class)
            return call.sent
        finally:
            call.plan = call.sent.plan if call.sent is not None else attempts.plan
            if call.plan is not None:
                self._telemetry.route(call.plan)

    async def _broken(self, call: Call, attempts: Attempts, why: str) -> None:
        """The engine's whole 200 answer was broken (``why``): its endpoint counted as failing,
        the attempt finished; a 502 when no retry remains."""
        sent, parsed = call.sent, call.parsed
        assert sent is not None and parsed is not None
        self._telemetry.broken_answer(sent.plan.decision.pool, why)
        log.warning("request %s: the engine answered 200 with a broken body (%s)",
                    call.request_id.decode(), why)
        self._dispatcher.answer_broken(sent, attempts, f"answered 200 with a broken body ({why})")
        call.sent, attempts.plan = None, sent.plan
        await self._dispatcher.finish(sent, parsed, succeeded=False, output_tokens=None,
                                      prompt_tokens=None)
        if not self._dispatcher.may_retry(attempts):
            raise GatewayError(502, "the engine's answer was empty, cut short or not an answer "
                               "of this API", code="upstream_broken", detail=why)

    async def _read(self, call: Call) -> bytes:
        """The engine's whole answer (a 502 when it breaks off or passes the limit)."""
        assert call.sent is not None
        try:
            return await call.sent.response.read(self._limits.response)
        except UpstreamStreamError as exc:
            self._dispatcher.engine_failed(call.sent, str(exc))
            raise GatewayError(502, "the engine's answer broke off or was too large",
                               code="upstream_broken", detail=str(exc)) from exc

    async def _whole(self, call: Call, exchange: Exchange, body: bytes) -> None:
        assert call.sent is not None
        if call.status == 200:
            call.usage = _usage_dict(body)
        media = call.sent.response.headers.get("content-type", "application/json").encode()
        call.response_started = True
        await exchange.respond(call.status, [
            (b"content-type", media), (REQUEST_ID_HEADER, call.request_id),
            *_route_headers(call.sent), *_limit_headers(call)], body)
        call.completed = True

    async def _stream(self, call: Call, exchange: Exchange) -> None:
        assert call.sent is not None and call.parsed is not None
        kind = ResponsesScanner if call.parsed.api_path is _RESPONSES else StreamScanner
        scanner = kind(not call.parsed.include_usage, self._clock, self._limits.event,
                       completions=call.parsed.api_path is _COMPLETIONS)
        call.response_started = True
        writer = await exchange.start(200, [
            (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
            (REQUEST_ID_HEADER, call.request_id), *_route_headers(call.sent),
            *_limit_headers(call)])
        response = call.sent.response
        relayed = relaying(response)
        try:
            if writer is not None and relayed is not None:
                await self._relay(call, scanner, writer, relayed)
            else:
                told = False
                async for chunk in response.chunks():
                    if out := scanner.feed(chunk):
                        await exchange.send(out, more=True)
                        told = told or self._first_token(call, scanner)
            end = scanner.rest()
            if scanner.ended:
                call.completed = True
            else:
                end += self._stream_broken(call)
        except UpstreamStreamError as exc:
            call.status = 502
            self._dispatcher.engine_failed(call.sent, str(exc))
            log.warning("request %s: the engine's stream broke off (%s)",
                        call.request_id.decode(), exc)
            end = error_event("the engine's stream broke off", "bad_gateway", "upstream_broken")
        finally:
            _take_measures(call, scanner)
        await exchange.send(end, more=False)

    def _stream_broken(self, call: Call) -> bytes:
        """A 200 stream that ended without its last event: the error event that ends it for
        the client, its endpoint counted as failing."""
        assert call.sent is not None
        call.status = 502
        self._telemetry.broken_answer(call.sent.plan.decision.pool, NO_END)
        self._dispatcher.engine_failed(call.sent, "a stream ended without its last event")
        log.warning("request %s: the engine's stream ended without its last event",
                    call.request_id.decode())
        return error_event("the engine's stream ended before its answer was complete",
                           "bad_gateway", "upstream_broken")

    async def _relay(self, call: Call, scanner: StreamScanner, writer: BodyWriter,
                     response: Relaying) -> None:
        """The stream relayed from the engine connection's callback: each piece scanned and
        written to the client there, with no task wake-up per piece (module docstring); this
        task wakes only when the client's buffer is full, to await its drain."""
        told = False

        def consume(piece: bytes) -> bool:
            nonlocal told
            out = scanner.feed(piece)
            if not out:
                return True
            more = writer.write(out)
            told = told or self._first_token(call, scanner)
            return more

        try:
            while not await response.relay(consume):
                if writer.gone:
                    raise ClientGone
                await writer.drain()
        finally:
            response.stop_relay()

    def _first_token(self, call: Call, scanner: StreamScanner) -> bool:
        """Tell the dispatcher of the stream's first token if it came; whether it did."""
        if scanner.first_token_at is None:
            return False
        assert call.sent is not None
        self._dispatcher.first_token(call.sent, scanner.first_token_at - call.started)
        return True

    async def _send_error(self, call: Call, exchange: Exchange, exc: GatewayError) -> None:
        """The error as OpenAI-shaped JSON, unless the response has started or the client
        is gone (then there is no one to tell)."""
        if call.response_started or call.client_gone:
            return
        call.response_started = True
        await exchange.respond(*error_response(exc, call.request_id))

    async def _finish(self, call: Call) -> None:
        """Close the upstream, release the reservations and record the request, once."""
        usage = call.usage or {}
        prompt_tokens = _int(usage.get("prompt_tokens"))
        completion = _int(usage.get("completion_tokens")) or call.completion_tokens
        if call.sent is not None and call.parsed is not None:
            await self._dispatcher.finish(  # seen through even if this task is cancelled
                call.sent, call.parsed, succeeded=call.status == 200 and call.completed,
                output_tokens=completion, prompt_tokens=prompt_tokens)
        if call.grant is not None:
            await self._access.settle(call.grant, _used(call, prompt_tokens, completion))
        record = self._record(call, prompt_tokens, completion)
        if call.parsed is not None and call.parsed.api_path in NO_INFERENCE:
            self._telemetry.count(record)
        else:
            self._telemetry.record(record)
            if self._trace is not None and call.sent is not None:
                self._trace.offer(call.parsed, call.sent.features, call.started, completion)
        if self._access_log is not None:
            self._access_log.write(record, call.request_id.decode(), call.caller.name,
                                   call.path)

    def _record(self, call: Call, prompt_tokens: int | None,
                completion: int | None) -> RequestRecord:
        sent, parsed, plan = call.sent, call.parsed, call.plan
        details = (call.usage or {}).get("prompt_tokens_details") or {}
        return RequestRecord(
            model=parsed.model if parsed else "",
            pool=call.pool,
            status=call.status or CLIENT_CLOSED,
            e2e_s=self._clock() - call.started,
            ttft_s=call.ttft_s,
            completion_tokens=completion,
            lever=plan.decision.lever if plan is not None else None,
            endpoint=sent.plan.first.url if sent else None,
            decode_endpoint=sent.plan.endpoint.url if sent and sent.plan.prefill else None,
            prompt_tokens=prompt_tokens,
            cached_tokens=_int(details.get("cached_tokens")) if isinstance(details, dict) else None,
            itl_s=call.itl_s,
            max_tokens=parsed.max_tokens if parsed else None,
            slo_class=call.slo_class,
            ttfb_s=call.ttfb_s,
            predicted_cached_tokens=sent.predicted_tokens if sent else None,
        )


def _client_request_id(value: bytes | None) -> bytes | None:
    """The client's own ``x-request-id``, when it is 1–128 visible ASCII characters."""
    return value if value is not None and _REQUEST_ID.fullmatch(value) else None


def _nothing() -> None:
    return None


def _uncancel() -> None:
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


def _read_headers(headers: Headers, call: Call) -> dict[bytes, bytes]:
    """The request headers ridge reads (lower-case names, as servers give them), and the
    session and SLO-class hints set on ``call``."""
    found = {}
    for name, value in headers:
        if name in _READ:
            found[name] = value
    if (session := found.get(SESSION_HEADER)) is not None:
        call.session_hint = session.decode("latin-1")
    if (slo := found.get(SLO_CLASS_HEADER)) is not None:
        call.slo_class = slo.decode("latin-1")
    return found


def check_content_type(value: bytes | None) -> None:
    """A body ridge reads must be declared JSON (``application/json`` or any ``+json`` type),
    or not declared at all; any other type is a 415. A web page can post ``text/plain``,
    form or multipart bodies to any origin without the browser asking first, so this is what
    keeps a page a visitor opens from driving the gateway (docs/gateway.md#request-bodies)."""
    if value is None or value == JSON_TYPE:
        return
    media = value.partition(b";")[0].strip().lower()
    if media == JSON_TYPE or media.endswith(b"+json"):
        return
    raise GatewayError(415, f"content-type {value.decode('latin-1')!r} is not JSON; send "
                       "application/json", code="unsupported_media_type")


def watch_disconnect(exchange: Exchange, call: Call) -> Callable[[], None]:
    """Cancel the running task when the client goes away (marking ``call.client_gone``);
    returns the function that stops watching."""
    task = exchange.task
    assert task is not None

    def gone() -> None:
        call.client_gone = True
        task.cancel()

    return exchange.watch(gone)


def _take_measures(call: Call, scanner: StreamScanner) -> None:
    if scanner.first_token_at is not None:
        call.ttft_s = scanner.first_token_at - call.started
    call.usage = scanner.usage
    call.completion_tokens = scanner.completion_tokens
    call.itl_s = tuple(scanner.gaps)


_USAGE_MEMBER = b'"stream_options": {"include_usage": true}'
"""The member :func:`_ask_for_usage` adds to a stream's body, encoded once."""


def _ask_for_usage(parsed: ParsedRequest) -> ParsedRequest:
    """A streaming request that does not ask for usage is sent asking for it (ridge counts
    tokens from it); every other request goes as the client sent it, byte for byte."""
    if not parsed.stream or parsed.include_usage:
        return parsed
    if "stream_options" not in parsed.payload:  # the common case: one member added
        return parsed.with_member("stream_options", {"include_usage": True}, _USAGE_MEMBER)
    options = dict(parsed.payload.get("stream_options") or {})
    options["include_usage"] = True
    return parsed.with_payload({**parsed.payload, "stream_options": options})


def _used(call: Call, prompt_tokens: int | None, completion: int | None) -> int | None:
    """Tokens a request used for its key's limits: none if it never reached an engine or runs
    no model there; the engine's usage; None (the charge stands) when the engine's usage is
    unknown."""
    if call.sent is None:
        return 0
    if prompt_tokens is None and completion is None:
        return 0 if call.parsed is not None and call.parsed.api_path in NO_INFERENCE else None
    return (prompt_tokens or 0) + (completion or 0)


def _limit_headers(call: Call) -> tuple[tuple[bytes, bytes], ...]:
    """The key's ``x-ratelimit-*`` headers (none for an unlimited caller)."""
    return call.grant.headers if call.grant is not None else ()


def _route_headers(sent: Dispatched) -> list[tuple[bytes, bytes]]:
    """The route decision, and which endpoint of its pool answered (its index in the pool's
    configured list: an engine's address is not the client's business)."""
    return [(b"x-ridge-route", sent.plan.decision.header_value().encode()),
            (b"x-ridge-endpoint", str(sent.endpoint_index).encode())]


def _usage_dict(body: bytes) -> dict[str, Any] | None:
    """The ``usage`` object of a whole JSON answer, parsed alone: the value after the last
    ``"usage":`` key (engines write the top-level one after the choices; generated text
    cannot hold those bytes, a JSON string escapes its quotes). A Responses API usage
    (``input_tokens``, ``output_tokens``) is given in the chat API's names."""
    at = body.rfind(b'"usage":')
    if at < 0:
        return None
    try:
        usage, _ = SCAN_JSON(body[at + 8:].decode("utf-8").lstrip(), 0)
    except (ValueError, UnicodeDecodeError, StopIteration):
        return None
    if not isinstance(usage, dict):
        return None
    return usage if "prompt_tokens" in usage else chat_usage(usage)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
