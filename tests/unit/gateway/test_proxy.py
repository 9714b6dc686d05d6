"""The generation handler on its own: an ASGI call with a scripted client and a fake dispatcher.

What the integration tests see over real HTTP, here without sockets: the body limit, the
request id, the relayed answer with its headers, the caps on an engine's answer and stream,
usage cut from a stream the client did not ask it for, and that every request is finished
and recorded once."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from backends.client import UpstreamStreamError, too_large
from gateway.dispatch import Attempts, Dispatched
from gateway.errors import GatewayError
from gateway.openai_request import Endpoint, ParsedRequest
from gateway.proxy import BodyLimits, ClientGone, Proxy, _client_request_id, read_body
from gateway.telemetry import Telemetry
from routing.decision import RouteDecision
from routing.features import RequestFeatures
from routing.router import RoutePlan
from routing.snapshots import EndpointSnapshot
from routing.state import StateView

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ENGINE = "http://10.1.2.3:8000"
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
TOKENS = (b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
          b'data: {"choices":[{"delta":{"content":"b"}}]}\n\n')


@dataclass
class Upstream:
    status: int = 200
    body: bytes = b'{"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}'
    chunks_: list[bytes] = field(default_factory=list)
    fail: Exception | None = None
    headers: Mapping[str, str] = field(default_factory=lambda: {"content-type":
                                                                "application/json"})

    async def read(self, limit: int | None = None) -> bytes:
        if limit is not None and len(self.body) > limit:
            raise too_large(limit)
        return self.body

    async def chunks(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks_:
            yield chunk
        if self.fail is not None:
            raise self.fail

    async def close(self) -> None:
        return None


@dataclass
class FakeDispatcher:
    upstream: Upstream
    finished: list[bool] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    sent_bodies: list[bytes] = field(default_factory=list)

    async def dispatch(self, parsed: ParsedRequest, session_hint: str | None,
                       attempts: Attempts) -> Dispatched:
        self.sent_bodies.append(parsed.body)
        features = RequestFeatures("m", (), 16, 3, 10, None, None, parsed.stream)
        plan = RoutePlan(RouteDecision("p", None, "none", "only_pool", ""),
                         EndpointSnapshot(ENGINE, "p", True))
        return Dispatched(features, StateView({}, {}, None, None), plan,
                          self.upstream)  # type: ignore[arg-type]

    async def finish(self, sent: Dispatched, parsed: ParsedRequest, *, succeeded: bool,
                     output_tokens: int | None, prompt_tokens: int | None) -> None:
        self.finished.append(succeeded)

    def engine_failed(self, sent: Dispatched, why: str) -> None:
        self.failed.append(why)


@dataclass
class Exchange:
    status: int = 0
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytes = b""

    def json(self) -> Any:
        return json.loads(self.body)


async def call(upstream: Upstream, payload: dict[str, Any] | bytes = CHAT,
               headers: list[tuple[bytes, bytes]] | None = None,
               limits: BodyLimits | None = None
               ) -> tuple[Exchange, FakeDispatcher, Telemetry]:
    dispatcher = FakeDispatcher(upstream)
    telemetry = Telemetry(CollectorRegistry(), frozenset({"m"}))
    proxy = Proxy(dispatcher, telemetry, limits or BodyLimits())  # type: ignore[arg-type]
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    out = Exchange()

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            out.status, out.headers = message["status"], dict(message["headers"])
        else:
            out.body += message.get("body", b"")

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "headers": headers or []}
    await proxy(scope, receive, send, Endpoint.CHAT)  # type: ignore[arg-type]
    return out, dispatcher, telemetry


def recorded(telemetry: Telemetry) -> float:
    value = telemetry.registry.get_sample_value("ridge_requests_total",
                                                {"model": "m", "pool": "p", "status": "200"})
    return value or 0.0


async def test_an_answer_is_relayed_with_the_route_and_a_request_id() -> None:
    out, dispatcher, _ = await call(Upstream())
    assert out.status == 200 and out.json()["usage"]["completion_tokens"] == 2
    assert out.headers[b"x-request-id"].startswith(b"req-")
    assert b"only_pool" in out.headers[b"x-ridge-route"]
    assert out.headers[b"x-ridge-endpoint"] == b"-1" or out.headers[b"x-ridge-endpoint"]
    assert dispatcher.finished == [True]


@pytest.mark.parametrize(("sent", "kept"), [
    (b"client-7", True), (b"a" * 128, True), (b"a" * 129, False), (b"two words", False),
    (b"", False), (b"caf\xc3\xa9", False)])
async def test_the_clients_request_id_is_kept_when_usable(sent: bytes, kept: bool) -> None:
    assert (_client_request_id(sent) == sent) is kept
    out, _, _ = await call(Upstream(), headers=[(b"x-request-id", sent)])
    assert (out.headers[b"x-request-id"] == sent) is kept


async def test_a_body_past_the_limit_is_a_413_before_dispatch() -> None:
    out, dispatcher, _ = await call(Upstream(), limits=BodyLimits(request=10))
    assert out.status == 413 and out.json()["error"]["code"] == "request_too_large"
    assert dispatcher.sent_bodies == [] and out.headers[b"x-request-id"]


async def test_read_body_refuses_a_declared_size_at_once_and_a_client_that_leaves() -> None:
    async def never() -> dict[str, Any]:
        raise AssertionError("the body must not be read")

    with pytest.raises(GatewayError):
        await read_body(never, 10, b"11")  # type: ignore[arg-type]

    async def gone() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    with pytest.raises(ClientGone):
        await read_body(gone, 10, None)  # type: ignore[arg-type]


async def test_an_answer_past_the_cap_is_a_502_naming_no_engine() -> None:
    out, dispatcher, _ = await call(Upstream(body=b"x" * 100), limits=BodyLimits(response=50))
    assert out.status == 502 and out.json()["error"]["code"] == "upstream_broken"
    assert b"10.1.2.3" not in out.body and b"exceeds" not in out.body
    assert dispatcher.failed == ["the response body exceeds 50 bytes"]
    assert dispatcher.finished == [False]


async def test_a_stream_is_relayed_and_the_usage_it_was_not_asked_for_is_cut() -> None:
    upstream = Upstream(chunks_=[TOKENS, USAGE, b"data: [DONE]\n\n"])
    out, dispatcher, _ = await call(upstream, {**CHAT, "stream": True})
    assert out.status == 200 and out.body == TOKENS + b"data: [DONE]\n\n"
    assert json.loads(dispatcher.sent_bodies[0])["stream_options"] == {"include_usage": True}
    assert dispatcher.finished == [True]


async def test_a_stream_that_breaks_ends_with_an_error_event_and_a_failing_endpoint() -> None:
    upstream = Upstream(chunks_=[TOKENS], fail=UpstreamStreamError(f"reset by {ENGINE}"))
    out, dispatcher, _ = await call(upstream, {**CHAT, "stream": True})
    last = out.body.rstrip().split(b"\n\n")[-1]
    assert out.body.startswith(TOKENS) and b"10.1.2.3" not in last
    assert json.loads(last[len(b"data: "):])["error"]["code"] == "upstream_broken"
    assert dispatcher.failed == [f"reset by {ENGINE}"] and dispatcher.finished == [False]


async def test_every_request_is_recorded_once() -> None:
    _, _, telemetry = await call(Upstream())
    assert recorded(telemetry) == 1.0
