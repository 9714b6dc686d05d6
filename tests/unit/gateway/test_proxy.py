"""The generation handler on its own: an ASGI call with a scripted client and a fake dispatcher.

What the integration tests see over real HTTP, here without sockets: the body limit, the
request id, the relayed answer with its headers, the caps on an engine's answer and stream,
usage cut from a stream the client did not ask it for, and that every request is finished
and recorded once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from backends.client import UpstreamStreamError, too_large
from gateway.access import Access
from gateway.dispatch import Attempts, Dispatched
from gateway.errors import GatewayError
from gateway.keys import KeyLimits, KeyRecord, KeyRing, make_record, new_key
from gateway.openai_request import Endpoint, ParsedRequest
from gateway.proxy import BodyLimits, ClientGone, Proxy, _client_request_id, read_body
from gateway.rate_limits import LocalLimiter
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
                       attempts: Attempts, *, key: str | None = None,
                       slo_class: str | None = None) -> Dispatched:
        self.sent_bodies.append(parsed.body)
        features = RequestFeatures("m", (), 16, 3, 10, None, None, parsed.stream)
        plan = RoutePlan(RouteDecision("p", None, "none", "only_pool", ""),
                         EndpointSnapshot(ENGINE, "p", True))
        return Dispatched(features, StateView({}, {}, None, None), plan,
                          self.upstream)  # type: ignore[arg-type]

    async def finish(self, sent: Dispatched, parsed: ParsedRequest, *, succeeded: bool,
                     output_tokens: int | None, prompt_tokens: int | None,
                     ttft_s: float | None = None) -> None:
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


def open_access() -> Access:
    """No keys: authentication off."""
    return Access(KeyRing(()), LocalLimiter())


async def call(upstream: Upstream, payload: dict[str, Any] | bytes = CHAT,
               headers: list[tuple[bytes, bytes]] | None = None,
               limits: BodyLimits | None = None, access: Access | None = None,
               stay: bool = False) -> tuple[Exchange, FakeDispatcher, Telemetry]:
    """One request through a Proxy; ``stay``: the client stays connected after its body
    (else it is gone at once, as soon as the handler listens for it)."""
    dispatcher = FakeDispatcher(upstream)
    telemetry = Telemetry(CollectorRegistry(), frozenset({"m"}))
    proxy = Proxy(dispatcher, telemetry, access or open_access(),  # type: ignore[arg-type]
                  limits or BodyLimits())
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    out = Exchange()

    async def receive() -> dict[str, Any]:
        if not messages and stay:
            await asyncio.Event().wait()
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


async def keyed_access(record_limits: KeyLimits | None = None, models: tuple[str, ...] = (),
                       timeout_s: float | None = None) -> tuple[Access, str]:
    """Keys required; one key with these limits and models."""
    key = new_key()
    ring = KeyRing([StaticKeys([make_record(key, "team", models=models,
                                            limits=record_limits or KeyLimits())])])
    await ring.refresh()
    return Access(ring, LocalLimiter(), request_timeout_s=timeout_s), key


@dataclass
class StaticKeys:
    records: list[KeyRecord]

    async def load(self) -> list[KeyRecord] | None:
        return self.records


async def test_a_request_without_a_key_is_refused_before_its_body_is_read() -> None:
    access, _ = await keyed_access()
    dispatcher = FakeDispatcher(Upstream())
    proxy = Proxy(dispatcher, Telemetry(CollectorRegistry(), frozenset({"m"})),  # type: ignore[arg-type]
                  access)
    out = Exchange()

    async def receive() -> dict[str, Any]:
        raise AssertionError("the body must not be read")

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            out.status, out.headers = message["status"], dict(message["headers"])
        else:
            out.body += message.get("body", b"")

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
    await proxy(scope, receive, send, Endpoint.CHAT)  # type: ignore[arg-type]
    assert out.status == 401 and out.json()["error"]["code"] == "invalid_api_key"
    assert out.headers[b"www-authenticate"] == b"Bearer"
    assert dispatcher.sent_bodies == []


async def test_a_model_the_key_may_not_use_does_not_exist_for_it() -> None:
    access, key = await keyed_access(models=("other",))
    out, dispatcher, _ = await call(Upstream(), access=access,
                                    headers=[(b"authorization", b"Bearer " + key.encode())])
    assert out.status == 404 and out.json()["error"]["code"] == "model_not_found"
    assert dispatcher.sent_bodies == []


async def test_a_limited_key_gets_ratelimit_headers_then_a_429() -> None:
    access, key = await keyed_access(KeyLimits(rpm=1))
    auth = [(b"authorization", b"Bearer " + key.encode())]
    first, _, _ = await call(Upstream(), access=access, headers=auth)
    assert first.status == 200
    assert first.headers[b"x-ratelimit-limit-requests"] == b"1"
    assert first.headers[b"x-ratelimit-remaining-requests"] == b"0"
    second, dispatcher, _ = await call(Upstream(), access=access, headers=auth)
    assert second.status == 429 and second.json()["error"]["code"] == "rate_limit_exceeded"
    assert second.headers[b"retry-after"] == b"60"
    assert dispatcher.sent_bodies == [] and b"x-request-id" in second.headers


async def test_tokens_are_settled_with_the_engines_usage() -> None:
    access, key = await keyed_access(KeyLimits(tpm=1000))
    auth = [(b"authorization", b"Bearer " + key.encode())]
    payload = {**CHAT, "max_tokens": 900}
    for _ in range(3):  # each charged ~920 at admission, settled at the usage: 5 tokens
        out, _, _ = await call(Upstream(), payload, access=access, headers=auth)
        assert out.status == 200


@dataclass
class SlowUpstream(Upstream):
    async def read(self, limit: int | None = None) -> bytes:
        await asyncio.sleep(30)
        return self.body


async def test_past_its_deadline_a_request_gets_a_504() -> None:
    access, key = await keyed_access(timeout_s=0.05)
    out, dispatcher, _ = await call(SlowUpstream(), access=access, stay=True,
                                    headers=[(b"authorization", b"Bearer " + key.encode())])
    assert out.status == 504 and out.json()["error"]["code"] == "request_timeout"
    assert dispatcher.finished == [False]
