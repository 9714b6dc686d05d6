"""HTTP for a simulated endpoint (aiohttp): the engine's OpenAI API, health, metrics, chaos.

Routes: ``POST /v1/chat/completions``, ``/v1/completions`` and ``/v1/responses`` (plain JSON or
SSE; :mod:`backends.sim.responses_shapes`), ``/v1/embeddings``, ``/tokenize``, ``/detokenize``
and the dialect's score, rerank and render paths (:mod:`backends.sim.pooling`), ``GET
/v1/models``,
``/version`` (the dialect's engine version), the engine's health paths (``/health``; SGLang
also ``/health_generate``), ``GET /metrics``, and the simulator's admin API: ``POST
/sim/fault`` / ``DELETE /sim/fault`` (see :mod:`backends.sim.faults`) and ``GET /sim/state``.
The application must run with ``handler_cancellation=True``: when a client disconnects, its
handler is cancelled and the request is aborted in the engine (it leaves the running batch and
frees its KV), as vLLM does. A client that leaves while its stream is written (a gateway
closing an upstream stream is routine) is one debug line on this module's logger, never a
logged traceback. The ``reset`` fault and the ``close`` fault's dropped connections are TCP
resets on every event loop's transports (:func:`hard_close`: asyncio's and uvloop's, which
``ridge demo`` runs on).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import struct
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from aiohttp import web

from backends.sim import pooling, responses_shapes, shapes
from backends.sim.behaviour import JSON
from backends.sim.endpoint import SimEndpoint
from backends.sim.exposition import CONTENT_TYPE
from backends.sim.faults import parse_command
from backends.sim.openai_api import ApiError, Generation, parse_responses, read_body
from backends.sim.pd import Intent
from backends.sim.runner import RequestHandle

log = logging.getLogger(__name__)

ENDPOINT: web.AppKey[SimEndpoint] = web.AppKey("sim_endpoint", SimEndpoint)
CLOSER: web.AppKey[Callable[[float], None]] = web.AppKey("sim_closer")
SSE_HEADERS = MappingProxyType(
    {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
)


def build_app(endpoint: SimEndpoint) -> web.Application:
    app = web.Application()
    app[ENDPOINT] = endpoint
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/responses", _responses)
    for path, answer in _POOLING.items():
        app.router.add_post(path, _pooled(answer))
    for path in endpoint.dialect.score_paths:
        app.router.add_post(path, _pooled(_score))
    for path in endpoint.dialect.rerank_paths:
        app.router.add_post(path, _pooled(_rerank))
    for path in endpoint.dialect.render_paths:
        app.router.add_post(path, _pooled(_RENDER[path]))
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/version", _version)
    app.router.add_get("/metrics", _metrics)
    for path in endpoint.dialect.health_paths:
        app.router.add_get(path, _HEALTH[path])
    app.router.add_post("/sim/fault", _set_fault)
    app.router.add_delete("/sim/fault", _clear_fault)
    app.router.add_get("/sim/state", _state)
    return app


def _error(ep: SimEndpoint, err: ApiError) -> web.Response:
    return web.json_response(
        shapes.error_body(ep.dialect, err), status=err.status, dumps=shapes.dumps
    )


def hard_close(transport: asyncio.Transport | None) -> None:
    """Drop a connection with a TCP reset (SO_LINGER 0), not a clean close. Any loop's
    transport: only the transport's own methods are used (uvloop's transports are not
    subclasses of asyncio's, and its ``socket`` extra is a stand-in that sets options on the
    real descriptor)."""
    if transport is None or transport.is_closing():
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):  # already gone: abort() still closes it
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


@contextlib.contextmanager
def client_may_leave(request: web.Request) -> Iterator[None]:
    """Around the writes of a stream: a client that went away (the write fails with a
    ConnectionError) ends it with one debug line instead of aiohttp's logged traceback; the
    handler's ``finally`` aborts the request in the engine."""
    try:
        yield
    except ConnectionError as exc:
        log.debug("client %s left during %s %s: %s", request.remote, request.method,
                  request.path, exc)


# -- generation --------------------------------------------------------------------------------


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


async def _faulted(ep: SimEndpoint) -> web.Response | None:
    """The ``delay`` fault waited out; the ``error`` fault's answer, if one is set."""
    delay = ep.faults.take("delay")
    if delay:
        await asyncio.sleep(delay)
    status = ep.faults.take("error")
    if status is not None:
        return _error(ep, ApiError(int(status), "simulated fault"))
    return None


async def _generate(request: web.Request, kind: shapes.Kind) -> web.StreamResponse:
    ep = request.app[ENDPOINT]
    if (faulted := await _faulted(ep)) is not None:
        return faulted
    reset_after = ep.faults.take("reset")
    try:
        body = await _json_body(request)
        gen = ep.parse(kind, body)
        intent = ep.intent(body)
    except ApiError as err:
        return _error(ep, err)
    rid = ep.new_id(kind)
    handle = ep.submit(gen, rid, intent)
    head = shapes.head(rid, int(time.time()), gen.model)
    try:
        if gen.stream:
            return await _stream(request, ep, gen, handle, head, reset_after)
        return await _complete(request, ep, gen, handle, head, intent, reset_after)
    finally:
        ep.runner.abort(handle)


async def _json_body(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object, or the engine's 400 (:func:`openai_api.read_body`)."""
    return read_body(await request.read(), request.app[ENDPOINT].dialect)


async def _complete(
    request: web.Request,
    ep: SimEndpoint,
    gen: Generation,
    handle: RequestHandle,
    head: dict[str, Any],
    intent: Intent | None,
    reset_after: float | None,
) -> web.StreamResponse:
    pieces, finish = await handle.collect()
    if reset_after is not None:
        hard_close(request.transport)
        return web.Response()
    status, body = whole_answer(ep, gen, handle, head, intent, pieces, finish)
    return web.json_response(body, status=status, dumps=shapes.dumps)


def whole_answer(ep: SimEndpoint, gen: Generation, handle: RequestHandle, head: dict[str, Any],
                 intent: Intent | None, pieces: list[str], finish: str) -> tuple[int, JSON]:
    """The status and body of a non-streamed answer whose tokens are ``pieces``."""
    if finish == "abort":
        err = ApiError(503, "the request was aborted before it finished")
        return err.status, shapes.error_body(ep.dialect, err)
    use = shapes.with_cached(shapes.usage(ep.dialect, gen.prompt_tokens, len(pieces)),
                             shapes.reported_cached(ep.pool, handle.request.cached_tokens))
    body = shapes.response(ep.dialect, gen.kind, head, "".join(pieces), finish, use)
    if (
        intent is not None
        and intent.side == "prefill"
        and ep.dialect.pd_protocol == "kv_transfer_params"
    ):
        body["kv_transfer_params"] = ep.pd.transfer_params(handle.request)
    return 200, body


async def _stream(
    request: web.Request,
    ep: SimEndpoint,
    gen: Generation,
    handle: RequestHandle,
    head: dict[str, Any],
    reset_after: float | None,
) -> web.StreamResponse:
    resp = web.StreamResponse(headers=SSE_HEADERS)
    with client_may_leave(request):
        await resp.prepare(request)
        writer = _ChunkWriter(request, resp, reset_after)
        if not writer.alive():
            return resp
        async for event in stream_events(ep, gen, handle, head):
            if event is shapes.DONE:
                await resp.write(event)
            elif not await writer.send_bytes(event):
                return resp
        await resp.write_eof()
    return resp


async def stream_events(ep: SimEndpoint, gen: Generation, handle: RequestHandle,
                        head: dict[str, Any], coalesce: bool = False) -> AsyncIterator[bytes]:
    """A streamed answer's SSE events as the engine produces them, one per engine step (the
    role with the first), then the usage chunk when asked for, then ``shapes.DONE``.
    ``coalesce``: after the first step's event, one event with every other token when the
    request is done (the first and last tokens keep their times; nothing wakes in between)."""
    produced = 0
    first = True
    while True:
        pieces, finish = await (handle.rest() if coalesce and not first
                                else handle.next_batch())
        if first and gen.kind == "chat":  # vLLM sends the role with the first engine output
            role = shapes.chunk(ep.dialect, "chat", head, None, role=True)
            zero = shapes.usage(ep.dialect, gen.prompt_tokens, 0, drop_none=True)
            yield shapes.sse(_maybe_usage(role, gen, zero))
        first = False
        produced += len(pieces)
        use = shapes.usage(ep.dialect, gen.prompt_tokens, produced, drop_none=True)
        chunk = shapes.chunk(ep.dialect, gen.kind, head, "".join(pieces), finish)
        yield shapes.sse(_maybe_usage(chunk, gen, use))
        if finish is not None:
            break
    if gen.include_usage:
        yield shapes.sse(shapes.usage_chunk(ep.dialect, gen.kind, head, shapes.with_cached(
            use, shapes.reported_cached(ep.pool, handle.request.cached_tokens))))
    yield shapes.DONE


def _maybe_usage(chunk: dict[str, Any], gen: Generation, use: dict[str, Any]) -> dict[str, Any]:
    return shapes.with_usage(chunk, use) if gen.continuous_usage else chunk


class _ChunkWriter:
    """Writes SSE chunks, resetting the connection after ``reset_after`` of them (a fault)."""

    def __init__(
        self, request: web.Request, resp: web.StreamResponse, reset_after: float | None
    ) -> None:
        self.request = request
        self.resp = resp
        self.left = None if reset_after is None else int(reset_after)

    def alive(self) -> bool:
        """False (and the connection reset) once the fault's chunk count is used up."""
        if self.left is not None and self.left <= 0:
            hard_close(self.request.transport)
            return False
        return True

    async def send(self, obj: dict[str, Any]) -> bool:
        return await self.send_bytes(shapes.sse(obj))

    async def send_bytes(self, data: bytes) -> bool:
        """Write ``data`` (whole events) as one chunk."""
        await self.resp.write(data)
        if self.left is not None:
            self.left -= 1
        return self.alive()


# -- the Responses API -------------------------------------------------------------------------


async def _responses(request: web.Request) -> web.StreamResponse:
    ep = request.app[ENDPOINT]
    if (faulted := await _faulted(ep)) is not None:
        return faulted
    reset_after = ep.faults.take("reset")
    try:
        body = await _json_body(request)
        gen = parse_responses(body, ep.dialect, ep.info)
    except ApiError as err:
        return _error(ep, err)
    turn = responses_shapes.Turn(f"resp_{ep.rng.getrandbits(64):016x}",
                                 f"msg_{ep.rng.getrandbits(64):016x}", int(time.time()),
                                 gen.model, body)
    handle = ep.submit(gen, turn.response_id, None)
    try:
        if gen.stream:
            return await _stream_responses(request, gen, handle, turn, reset_after)
        pieces, finish = await handle.collect()
        if reset_after is not None:
            hard_close(request.transport)
            return web.Response()
        if finish == "abort":
            return _error(ep, ApiError(503, "the request was aborted before it finished"))
        use = responses_shapes.usage(gen.prompt_tokens, len(pieces))
        answer = responses_shapes.response(turn, "".join(pieces), finish, gen.max_tokens, use)
        return web.json_response(answer, dumps=shapes.dumps)
    finally:
        ep.runner.abort(handle)


async def _stream_responses(request: web.Request, gen: Generation, handle: RequestHandle,
                            turn: responses_shapes.Turn,
                            reset_after: float | None) -> web.StreamResponse:
    """The Responses event stream: one delta per engine step (module docstring of
    :mod:`backends.sim.responses_shapes`)."""
    resp = web.StreamResponse(headers=SSE_HEADERS)
    with client_may_leave(request):
        await resp.prepare(request)
        await _write_responses(_ChunkWriter(request, resp, reset_after), gen, handle,
                               responses_shapes.EventStream(turn))
    return resp


async def _write_responses(writer: _ChunkWriter, gen: Generation, handle: RequestHandle,
                           events: responses_shapes.EventStream) -> None:
    """The Responses events of ``handle``'s tokens, until the end or the ``reset`` fault."""
    if not writer.alive() or not await writer.send_bytes(events.opening(gen.max_tokens)):
        return
    text: list[str] = []
    produced = 0
    while True:
        pieces, finish = await handle.next_batch()
        produced += len(pieces)
        piece = "".join(pieces)
        if piece:
            out = events.delta(piece) if text else events.first_text() + events.delta(piece)
            text.append(piece)
            if not await writer.send_bytes(out):
                return
        if finish is not None:
            break
    opened = b"" if text else events.first_text()
    use = responses_shapes.usage(gen.prompt_tokens, produced)
    closing = events.closing("".join(text), finish, gen.max_tokens, use)
    if await writer.send_bytes(opened + closing):
        await writer.resp.write_eof()


# -- the APIs that generate nothing ------------------------------------------------------------

PoolingAnswer = Callable[[SimEndpoint, dict[str, Any]], JSON | list[JSON]]


def _pooled(answer: PoolingAnswer) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The handler of one API answered at once from its body (:mod:`backends.sim.pooling`);
    the ``delay`` and ``error`` faults apply."""

    async def handle(request: web.Request) -> web.Response:
        ep = request.app[ENDPOINT]
        if (faulted := await _faulted(ep)) is not None:
            return faulted
        try:
            return web.json_response(answer(ep, await _json_body(request)), dumps=shapes.dumps)
        except ApiError as err:
            return _error(ep, err)
    return handle


def _pooling_id(ep: SimEndpoint) -> str:
    return f"{ep.rng.getrandbits(64):016x}"


def _embeddings(ep: SimEndpoint, body: dict[str, Any]) -> JSON:
    return pooling.embeddings(body, ep.dialect, ep.info, _pooling_id(ep), int(time.time()))


def _tokenize(ep: SimEndpoint, body: dict[str, Any]) -> JSON:
    return pooling.tokenize(body, ep.dialect, ep.info)


def _detokenize(ep: SimEndpoint, body: dict[str, Any]) -> JSON:
    return pooling.detokenize(body, ep.dialect, ep.info)


def _score(ep: SimEndpoint, body: dict[str, Any]) -> JSON:
    return pooling.score(body, ep.dialect, ep.info, _pooling_id(ep), int(time.time()))


def _rerank(ep: SimEndpoint, body: dict[str, Any]) -> JSON:
    return pooling.rerank(body, ep.dialect, ep.info, _pooling_id(ep))


def _render_id(prefix: str) -> str:
    # vLLM's random_uuid; not drawn from the endpoint's seeded stream, which generation uses
    return f"{prefix}{uuid.uuid4().hex}"


def _render_chat(ep: SimEndpoint, body: dict[str, Any]) -> JSON:
    gen = ep.parse("chat", body)
    return pooling.rendered(gen, ep.prompt_ids(gen), _render_id("chatcmpl-"), body)


def _render_completion(ep: SimEndpoint, body: dict[str, Any]) -> list[JSON]:
    gen = ep.parse("completion", body)  # one prompt: the simulator serves no more
    return [pooling.rendered(gen, ep.prompt_ids(gen), _render_id("cmpl-"), body)]


_RENDER: Mapping[str, PoolingAnswer] = MappingProxyType({
    "/v1/chat/completions/render": _render_chat,
    "/v1/completions/render": _render_completion,
})
"""vLLM's render paths → their answers: a chat request's ``GenerateRequest``, a completions
request's list of them."""


_POOLING: Mapping[str, PoolingAnswer] = MappingProxyType({
    "/v1/embeddings": _embeddings,
    "/tokenize": _tokenize,
    "/detokenize": _detokenize,
})


# -- everything else ---------------------------------------------------------------------------


async def _models(request: web.Request) -> web.Response:
    ep = request.app[ENDPOINT]
    body = shapes.models_body(ep.dialect, ep.info, int(ep.started), f"modelperm-{ep.engine_id}")
    return web.json_response(body, dumps=shapes.dumps)


async def _version(request: web.Request) -> web.Response:
    return web.json_response({"version": request.app[ENDPOINT].dialect.version})


async def _metrics(request: web.Request) -> web.Response:
    ep = request.app[ENDPOINT]
    return web.Response(body=ep.metrics_text().encode(), headers={"Content-Type": CONTENT_TYPE})


async def _health(request: web.Request) -> web.Response:
    ep = request.app[ENDPOINT]
    return web.Response(status=503 if ep.faults.active("unhealthy") else 200)


async def _health_generate(request: web.Request) -> web.Response:
    ep = request.app[ENDPOINT]
    if ep.faults.active("unhealthy"):
        return web.Response(status=503)
    finish = await ep.health_generate()
    return web.Response(status=200 if finish != "abort" else 503)


_HEALTH: Mapping[str, Callable[[web.Request], Awaitable[web.Response]]] = MappingProxyType(
    {
        "/health": _health,
        "/health_generate": _health_generate,
    }
)


async def _set_fault(request: web.Request) -> web.Response:
    ep = request.app[ENDPOINT]
    try:
        cmd = parse_command(await request.json())
    except (ValueError, json.JSONDecodeError) as exc:
        return web.json_response({"error": str(exc)}, status=400)
    if cmd.kind == "clear":
        ep.faults.clear()
    elif cmd.kind == "close":
        closer = request.app.get(CLOSER)
        if closer is None:
            return web.json_response({"error": "this endpoint cannot close"}, status=400)
        closer(cmd.value)
        return web.json_response({"ok": True, "closing_for_s": cmd.value})
    else:
        ep.faults.set(cmd.kind, cmd.value, cmd.count)
    return web.json_response({"ok": True, "faults": ep.faults.describe()})


async def _clear_fault(request: web.Request) -> web.Response:
    request.app[ENDPOINT].faults.clear()
    return web.json_response({"ok": True, "faults": {}})


async def _state(request: web.Request) -> web.Response:
    ep = request.app[ENDPOINT]
    core = ep.core
    body = {
        "pool": ep.pool.name,
        "engine": ep.pool.engine.value,
        "role": ep.pool.role.value,
        "sim_time_s": ep.clock.now(),
        "running": core.num_running,
        "waiting": core.num_waiting,
        "transferring": core.num_transferring,
        "held": len(core.held),
        "kv_cache_usage": core.pool.usage,
        "kv_blocks": core.pool.num_blocks,
        "block_size": core.pool.block_size,
        "faults": ep.faults.describe(),
    }
    return web.json_response(body, dumps=shapes.dumps)
