"""The generation handler on its own: an ASGI call with a scripted client and a fake dispatcher.

What the integration tests see over real HTTP, here without sockets: the body limit, the
request id, the relayed answer with its headers, the caps on an engine's answer and stream,
usage cut from a stream the client did not ask it for, and that every request is finished
and recorded once."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from backends.registry.endpoints import EndpointRegistry
from backends.registry.status import PollResult
from backends.upstream.client import UpstreamStreamError, too_large
from gateway.access.control import Access
from gateway.access.keys import KeyLimits, KeyRecord, KeyRing, make_record, new_key
from gateway.access.limits import LocalLimiter
from gateway.app import build_router
from gateway.request.body import ApiPath, ParsedRequest
from gateway.request.dispatch import Attempts, Dispatched, Dispatcher
from gateway.request.proxy import _USAGE_MEMBER, BodyLimits, Proxy, _client_request_id
from gateway.server.errors import GatewayError
from gateway.telemetry.access_log import AccessLog
from gateway.telemetry.prometheus import Telemetry
from routing.decision import RouteDecision
from routing.features import FeatureExtractor, RequestFeatures
from routing.router import RoutePlan
from routing.snapshots import EndpointSnapshot
from routing.state.memory import MemoryState
from routing.state.protocol import StateView
from tests.fakes.harness import fleet_of

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
    closes_at_once = True

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
    first_tokens: list[float] = field(default_factory=list)
    before_headers: GatewayError | None = None
    """Raised after placing the request twice, as when every engine refused it."""
    then: list[Upstream] = field(default_factory=list)
    """What later dispatches of the same request reach, in turn (then ``upstream`` again)."""
    retries: int = 1

    async def dispatch(self, parsed: ParsedRequest, session_hint: str | None,
                       attempts: Attempts, *, key: str | None = None,
                       slo_class: str | None = None) -> Dispatched:
        upstream = self.then.pop(0) if self.sent_bodies and self.then else self.upstream
        self.sent_bodies.append(parsed.body)
        features = RequestFeatures("m", (), 16, 3, 10, None, None, parsed.stream)
        plan = RoutePlan(RouteDecision("p", None, "none", "only_pool", ""),
                         EndpointSnapshot(ENGINE, "p", True))
        if self.before_headers is not None:
            attempts.plan, attempts.failures = plan, 2
            raise self.before_headers
        return Dispatched(features, StateView({}, {}, None, None), plan,
                          upstream)  # type: ignore[arg-type]

    def may_retry(self, attempts: Attempts) -> bool:
        return attempts.failures <= self.retries

    def answer_broken(self, sent: Dispatched, attempts: Attempts, why: str) -> None:
        attempts.failures += 1
        self.failed.append(why)

    async def finish(self, sent: Dispatched, parsed: ParsedRequest, *, succeeded: bool,
                     output_tokens: int | None, prompt_tokens: int | None) -> None:
        self.finished.append(succeeded)

    def first_token(self, sent: Dispatched, ttft_s: float) -> None:
        self.first_tokens.append(ttft_s)

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
               stay: bool = False, api_path: ApiPath = ApiPath.CHAT,
               before_headers: GatewayError | None = None,
               then: list[Upstream] | None = None, retries: int = 1,
               ) -> tuple[Exchange, FakeDispatcher, Telemetry]:
    """One request to ``api_path`` through a Proxy; ``stay``: the client stays connected after
    its body (else it is gone at once, as soon as the handler listens for it);
    ``before_headers``: the dispatcher's error after placing it."""
    dispatcher = FakeDispatcher(upstream, before_headers=before_headers, then=then or [],
                                retries=retries)
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

    scope = {"type": "http", "method": "POST", "path": api_path.value, "headers": headers or []}
    await proxy(scope, receive, send, api_path)  # type: ignore[arg-type]
    return out, dispatcher, telemetry


def recorded(telemetry: Telemetry) -> float:
    value = telemetry.metrics_registry.get_sample_value("ridge_requests_total",
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


@pytest.mark.parametrize(("media", "served"), [
    (b"application/json", True), (b"Application/JSON; charset=utf-8", True),
    (b"application/vnd.api+json", True), (None, True), (b"text/plain", False),
    (b"text/plain;charset=UTF-8", False), (b"application/x-www-form-urlencoded", False),
    (b"multipart/form-data; boundary=x", False), (b"", False)])
async def test_a_body_not_declared_json_is_a_415_before_dispatch(media: bytes | None,
                                                                  served: bool) -> None:
    """What a web page can post cross-origin without a preflight (text/plain, a form) is
    refused; JSON or no type at all is served."""
    headers = [] if media is None else [(b"content-type", media)]
    out, dispatcher, _ = await call(Upstream(), headers=headers)
    if served:
        assert out.status == 200
        return
    assert out.status == 415 and out.json()["error"]["code"] == "unsupported_media_type"
    assert out.json()["error"]["type"] == "invalid_request_error"
    assert dispatcher.sent_bodies == []


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
    assert len(dispatcher.first_tokens) == 1 and dispatcher.first_tokens[0] >= 0  # told once


@pytest.mark.parametrize("options", [None, {"include_usage": False}, {"continuous": True}])
async def test_a_stream_is_sent_asking_for_usage_whatever_its_stream_options(
        options: dict[str, bool] | None) -> None:
    upstream = Upstream(chunks_=[TOKENS, USAGE, b"data: [DONE]\n\n"])
    payload = {**CHAT, "stream": True, **({"stream_options": options} if options else {})}
    out, dispatcher, _ = await call(upstream, payload)
    assert out.status == 200 and out.body == TOKENS + b"data: [DONE]\n\n"
    sent = json.loads(dispatcher.sent_bodies[0])
    assert sent == {**payload, "stream_options": {**(options or {}), "include_usage": True}}


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
    await proxy(scope, receive, send, ApiPath.CHAT)  # type: ignore[arg-type]
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


# -- the other APIs ----------------------------------------------------------------------------

RESPONSES_STREAM = [
    b'event: response.created\ndata: {"response":{"output":[],"usage":null},'
    b'"type":"response.created"}\n\n',
    b'event: response.output_text.delta\ndata: {"delta":"a","type":'
    b'"response.output_text.delta"}\n\n',
    b'event: response.output_text.delta\ndata: {"delta":"b","type":'
    b'"response.output_text.delta"}\n\n',
    b'event: response.completed\ndata: {"response":{"output":[],"usage":{"input_tokens":3,'
    b'"output_tokens":2,"total_tokens":5}},"type":"response.completed"}\n\n',
]


def sample(telemetry: Telemetry, name: str, **labels: str) -> float | None:
    return telemetry.metrics_registry.get_sample_value(name, {"model": "m", "pool": "p", **labels})


async def test_a_responses_stream_is_relayed_untouched_and_measured() -> None:
    payload = {"model": "m", "input": "hi", "stream": True}
    out, dispatcher, telemetry = await call(Upstream(chunks_=RESPONSES_STREAM), payload,
                                            api_path=ApiPath.RESPONSES)
    assert out.status == 200 and out.body == b"".join(RESPONSES_STREAM)
    assert out.headers[b"content-type"] == b"text/event-stream"
    assert dispatcher.sent_bodies == [json.dumps(payload).encode()]  # no stream_options added
    assert len(dispatcher.first_tokens) == 1 and dispatcher.finished == [True]
    assert sample(telemetry, "ridge_prompt_tokens_total", lever="none") == 3
    assert sample(telemetry, "ridge_completion_tokens_total", lever="none") == 2
    assert sample(telemetry, "ridge_time_to_first_token_seconds_count", lever="none") == 1


async def test_a_whole_responses_answer_is_counted_by_its_usage() -> None:
    body = (b'{"id":"resp_1","object":"response","output":[],"usage":{"input_tokens":4,'
            b'"input_tokens_details":{"cached_tokens":1},"output_tokens":6,'
            b'"total_tokens":10},"user":null}')
    out, _, telemetry = await call(Upstream(body=body), {"model": "m", "input": "hi"},
                                   api_path=ApiPath.RESPONSES)
    assert out.status == 200 and out.body == body
    assert sample(telemetry, "ridge_prompt_tokens_total", lever="none") == 4
    assert sample(telemetry, "ridge_completion_tokens_total", lever="none") == 6
    assert sample(telemetry, "ridge_cached_prompt_tokens_total", lever="none") == 1


async def test_embeddings_are_relayed_whole_with_their_prompt_tokens() -> None:
    body = (b'{"id":"embd-1","object":"list","data":[{"index":0,"object":"embedding",'
            b'"embedding":[0.5]}],"usage":{"prompt_tokens":7,"total_tokens":7,'
            b'"completion_tokens":0}}')
    out, _, telemetry = await call(Upstream(body=body), {"model": "m", "input": "x",
                                                         "stream": True},
                                   api_path=ApiPath.EMBEDDINGS)
    assert out.status == 200 and out.body == body
    assert out.headers[b"content-type"] == b"application/json"  # whole, stream or not
    assert sample(telemetry, "ridge_prompt_tokens_total", lever="none") == 7
    assert sample(telemetry, "ridge_request_duration_seconds_count", lever="none") == 1


async def test_tokenize_is_counted_and_nothing_else() -> None:
    body = b'{"count":1,"max_model_len":2048,"tokens":[42],"token_strs":null}'
    out, _, telemetry = await call(Upstream(body=body), {"model": "m", "prompt": "x"},
                                   api_path=ApiPath.TOKENIZE)
    assert out.status == 200 and out.body == body
    assert recorded(telemetry) == 1.0
    assert sample(telemetry, "ridge_request_duration_seconds_count", lever="none") is None
    assert telemetry.metrics_registry.get_sample_value(
        "ridge_slo_evaluated_requests_total",
        {"model": "m", "pool": "p", "lever": "none", "slo_class": "default"}) is None


async def test_tokenize_uses_none_of_a_keys_tokens() -> None:
    access, key = await keyed_access(KeyLimits(tpm=300))
    auth = [(b"authorization", b"Bearer " + key.encode())]
    for _ in range(3):  # each charged ~260 at admission (no usage to settle by), given back
        out, _, _ = await call(Upstream(body=b'{"count":1,"tokens":[1]}'),
                               {"model": "m", "prompt": "x"}, access=access, headers=auth,
                               api_path=ApiPath.TOKENIZE)
        assert out.status == 200


# -- what telemetry is told ----------------------------------------------------------------------


async def test_a_whole_answer_has_a_time_to_first_byte_and_a_stream_a_ttft() -> None:
    _, _, whole = await call(Upstream())
    assert sample(whole, "ridge_time_to_first_byte_seconds_count", lever="none") == 1
    assert sample(whole, "ridge_time_to_first_token_seconds_count", lever="none") is None
    _, _, streamed = await call(Upstream(chunks_=[TOKENS, USAGE]), {**CHAT, "stream": True})
    assert sample(streamed, "ridge_time_to_first_token_seconds_count", lever="none") == 1
    assert sample(streamed, "ridge_time_to_first_byte_seconds_count", lever="none") is None
    _, _, refused = await call(Upstream(status=400, body=b'{"error": {}}'))
    assert sample(refused, "ridge_time_to_first_byte_seconds_count", lever="none") is None


async def test_a_failure_before_any_engines_headers_counts_under_the_chosen_pool() -> None:
    error = GatewayError(502, "no engine could take the request", code="upstream_unreachable")
    out, dispatcher, telemetry = await call(Upstream(), before_headers=error)
    assert out.status == 502 and dispatcher.finished == []
    get = telemetry.metrics_registry.get_sample_value
    assert get("ridge_requests_total", {"model": "m", "pool": "p", "status": "502"}) == 1
    assert get("ridge_requests_total", {"model": "m", "pool": "none", "status": "502"}) is None
    assert get("ridge_route_decisions_total",
               {"pool": "p", "lever": "none", "reason": "only_pool"}) == 1
    assert get("ridge_upstream_retries_total", {"pool": "p"}) == 2
    assert get("ridge_slo_violations_total", {"model": "m", "pool": "p", "lever": "none",
                                              "slo_class": "default", "slo": "error"}) == 1


@dataclass
class HeldUpstream(Upstream):
    """A whole answer whose body comes only when ``release`` is set."""

    reading: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def read(self, limit: int | None = None) -> bytes:
        self.reading.set()
        await self.release.wait()
        return self.body


async def test_a_non_streamed_request_is_in_flight_from_dispatch_to_finish() -> None:
    fleet = fleet_of({"p": [ENGINE]})
    registry = EndpointRegistry(fleet)
    registry.record_poll(ENGINE, PollResult(registry.now(), healthy=True))
    upstream, state = HeldUpstream(), MemoryState()

    class Client:
        async def send(self, url: str, body: bytes, headers: Mapping[str, str]) -> Upstream:
            return upstream

    telemetry = Telemetry(CollectorRegistry(), frozenset({"m"}))
    telemetry.bind_fleet(fleet, registry.snapshot, state)
    dispatcher = Dispatcher(registry, Client(), build_router(fleet),  # type: ignore[arg-type]
                            state, FeatureExtractor(), retries=0)
    proxy = Proxy(dispatcher, telemetry, open_access())
    messages = [{"type": "http.request", "body": json.dumps(CHAT).encode()}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        return None

    def in_flight() -> float | None:
        return telemetry.metrics_registry.get_sample_value("ridge_requests_in_flight",
                                                           {"pool": "p"})

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
    task = asyncio.ensure_future(proxy(scope, receive, send, ApiPath.CHAT))  # type: ignore[arg-type]
    await asyncio.wait_for(upstream.reading.wait(), 10)
    assert in_flight() == 1  # the engine has it, its answer not yet in
    upstream.release.set()
    await asyncio.wait_for(task, 10)
    assert in_flight() == 0


def test_the_usage_member_kept_encoded_is_what_json_writes() -> None:
    assert json.dumps({"stream_options": {"include_usage": True}}).encode()[1:-1] == _USAGE_MEMBER


def broken(telemetry: Telemetry, reason: str) -> float | None:
    return telemetry.metrics_registry.get_sample_value(
        "ridge_upstream_broken_answers_total", {"pool": "p", "reason": reason})


@pytest.mark.parametrize(("body", "reason"), [
    (b"", "empty"), (b'{"choices": [{"text": "a"', "cut_short"), (b'{"object": "x"}',
                                                                   "not_the_api"),
    (b"<html>bad gateway</html>", "not_the_api")])
async def test_a_broken_whole_answer_is_sent_elsewhere_and_counted(body: bytes,
                                                                   reason: str) -> None:
    """Nothing of a whole answer reached the client: a broken one is retried, and the client
    gets the good answer of the next engine."""
    out, dispatcher, telemetry = await call(Upstream(body=body), then=[Upstream()])
    assert out.status == 200 and out.json()["usage"]["completion_tokens"] == 2
    assert len(dispatcher.sent_bodies) == 2 and dispatcher.finished == [False, True]
    assert dispatcher.failed == [f"answered 200 with a broken body ({reason})"]
    assert broken(telemetry, reason) == 1
    assert telemetry.metrics_registry.get_sample_value("ridge_upstream_retries_total",
                                                       {"pool": "p"}) == 1
    assert recorded(telemetry) == 1


async def test_a_broken_whole_answer_with_no_retry_left_is_a_502() -> None:
    out, dispatcher, telemetry = await call(Upstream(body=b'{"choices": ['), retries=0)
    assert out.status == 502 and out.json()["error"]["code"] == "upstream_broken"
    assert ENGINE not in out.body.decode() and dispatcher.finished == [False]
    assert telemetry.metrics_registry.get_sample_value(
        "ridge_requests_total", {"model": "m", "pool": "p", "status": "502"}) == 1


@pytest.mark.parametrize("chunks", [[], [TOKENS], [TOKENS, USAGE]])
async def test_a_stream_without_its_end_ends_with_an_error_event(chunks: list[bytes]) -> None:
    out, dispatcher, telemetry = await call(Upstream(chunks_=chunks),
                                            {**CHAT, "stream": True})
    assert out.status == 200 and out.body.startswith(b"".join(chunks[:1]))
    last = json.loads(out.body.rsplit(b"data: ", 1)[1])
    assert last["error"]["code"] == "upstream_broken"
    assert dispatcher.failed == ["a stream ended without its last event"]
    assert dispatcher.finished == [False]
    assert broken(telemetry, "no_end") == 1
    assert telemetry.metrics_registry.get_sample_value(
        "ridge_requests_total", {"model": "m", "pool": "p", "status": "502"}) == 1


async def test_a_responses_stream_without_its_completed_event_is_broken() -> None:
    out, dispatcher, _ = await call(Upstream(chunks_=RESPONSES_STREAM[:-1]),
                                    {"model": "m", "input": "hi", "stream": True},
                                    api_path=ApiPath.RESPONSES)
    assert b'"upstream_broken"' in out.body.rsplit(b"\n\n", 2)[-2]
    assert dispatcher.failed == ["a stream ended without its last event"]


async def test_with_an_access_log_each_request_is_one_line(
        caplog: pytest.LogCaptureFixture) -> None:
    dispatcher = FakeDispatcher(Upstream())
    proxy = Proxy(dispatcher, Telemetry(CollectorRegistry(), frozenset({"m"})),  # type: ignore[arg-type]
                  open_access(), access_log=AccessLog("text"))
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": json.dumps(CHAT).encode(), "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "headers": [(b"x-request-id", b"abc-1")]}
    with caplog.at_level(logging.INFO, "ridge.access"):
        await proxy(scope, receive, send, ApiPath.CHAT)  # type: ignore[arg-type]
    [line] = caplog.messages
    assert line.startswith("request_id=abc-1 key=- path=/v1/chat/completions model=m pool=p "
                           "lever=none endpoint=http://10.1.2.3:8000 status=200 ttft_ms=")
