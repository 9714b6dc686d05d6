"""Dispatch over a fake upstream: measure once, place through the state, send, release."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from backends.registry.breaker import CircuitState
from backends.registry.endpoints import EndpointRegistry
from backends.registry.status import PollResult
from backends.upstream.client import UpstreamConnectError, UpstreamTimeout
from config.fleet import parse_fleet
from config.pools import Adapter
from gateway.access.admission import Admission, AdmissionConfig, Route
from gateway.app import build_router
from gateway.request.body import GENERATION, ApiPath, parse_request
from gateway.request.dispatch import (
    FEATURE_KINDS,
    MAX_MODELS_KEPT,
    Attempts,
    Dispatcher,
    ProbeAuth,
    engine_model_names,
)
from gateway.server.errors import GatewayError
from gateway.telemetry.slos import ModelSlo, SloPolicy
from routing.features import FeatureConfig, FeatureExtractor, RequestFeatures, RequestInfo
from routing.formulas import Bounds
from routing.router import RoutePlan
from routing.snapshots import EngineMetrics
from routing.state.memory import MemoryState
from routing.state.protocol import Ask, Outcome, Placed, Reservation, RouterState
from tests.fakes.harness import ends_without_suspending, fleet_of

A, B = "http://a:1", "http://b:1"
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'


@dataclass
class Response:
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    closed: bool = False
    closes_at_once = True

    async def read(self, limit: int | None = None) -> bytes:
        return b"{}"

    async def chunks(self) -> AsyncIterator[bytes]:
        yield b"{}"

    async def close(self) -> None:
        self.closed = True


@dataclass
class Client:
    """Answers every URL as ``modes`` says: ok, refuse, timeout, or a status code."""

    modes: dict[str, str] = field(default_factory=dict)
    sent: list[str] = field(default_factory=list)

    async def send(self, url: str, body: bytes, headers: Mapping[str, str]) -> Response:
        self.sent.append(url)
        mode = self.modes.get(url.rsplit("/v1", 1)[0], "ok")
        if mode == "refuse":
            raise UpstreamConnectError("connection refused")
        if mode == "timeout":
            raise UpstreamTimeout("no response within 1 s")
        return Response(int(mode)) if mode.isdigit() else Response()

    async def aclose(self) -> None:
        return None


class CountingExtractor:
    """The feature extractor, recording each request's info (around one: the class is compiled
    with the routing modules, and Python code cannot subclass a compiled class)."""

    def __init__(self) -> None:
        self.inner = FeatureExtractor()
        self.calls: list[RequestInfo] = []

    @property
    def config(self) -> FeatureConfig:
        return self.inner.config

    def extract(self, payload: dict[str, Any], info: RequestInfo) -> RequestFeatures:
        self.calls.append(info)
        return self.inner.extract(payload, info)


class GatedState:
    """The in-memory state with a finish that waits for ``gate`` first, as one releasing over
    the network (around one, for the same reason)."""

    finishes_at_once = False

    def __init__(self) -> None:
        self.inner = MemoryState()
        self.entered, self.gate = asyncio.Event(), asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def finish(self, reservation: Reservation, outcome: Outcome) -> None:
        self.entered.set()
        await self.gate.wait()
        await self.inner.finish(reservation, outcome)


def setup(modes: dict[str, str] | None = None, healthy: tuple[str, ...] = (A, B),
          state: RouterState | None = None,
          ) -> tuple[Dispatcher, Client, RouterState, EndpointRegistry, CountingExtractor]:
    fleet = fleet_of({"p": [A, B]})
    registry = EndpointRegistry(fleet)
    for url in healthy:
        registry.record_poll(url, PollResult(registry.now(), healthy=True))
    client, extractor = Client(modes or {}), CountingExtractor()
    state = state or MemoryState()
    dispatcher = Dispatcher(registry, client, build_router(fleet), state, extractor, retries=1)
    return dispatcher, client, state, registry, extractor


async def test_a_request_is_measured_once_placed_and_released_on_finish() -> None:
    dispatcher, client, state, _, extractor = setup()
    await state.finish(Reservation("x", A, 0), Outcome("m", (), 10, 0, 77, None, True))
    parsed = parse_request(ApiPath.CHAT, BODY)
    sent = await dispatcher.dispatch(parsed, None, Attempts())
    assert len(extractor.calls) == 1 and extractor.calls[0].learned_output_tokens == 77
    assert sent.features.expected_output_tokens == 77  # learned: no max_tokens was given
    assert client.sent == [A + "/v1/chat/completions"] and sent.endpoint_index == 0
    assert state.in_flight()[A].requests == 1
    await dispatcher.finish(sent, parsed, succeeded=True, output_tokens=5, prompt_tokens=None)
    assert state.in_flight() == {} and isinstance(sent.response, Response)
    assert sent.response.closed


async def test_a_finish_that_never_suspends_runs_in_the_callers_task() -> None:
    """The in-memory state and a response that closes at once: the finish ends on its first
    step (no task to shield it, no turn of the event loop)."""
    dispatcher, _, state, _, _ = setup()
    parsed = parse_request(ApiPath.CHAT, BODY)
    sent = await dispatcher.dispatch(parsed, None, Attempts())
    assert ends_without_suspending(dispatcher.finish(sent, parsed, succeeded=True,
                                                     output_tokens=5, prompt_tokens=None))
    assert state.in_flight() == {} and cast(Response, sent.response).closed


async def test_a_finish_that_awaits_is_seen_through_when_its_task_is_cancelled() -> None:
    """A state whose finish suspends (Redis) is finished in a task of its own: a client that
    leaves as its response ends cancels the request's task, not the release."""
    state = GatedState()
    dispatcher, _, _, _, _ = setup(state=cast(RouterState, state))
    parsed = parse_request(ApiPath.CHAT, BODY)
    sent = await dispatcher.dispatch(parsed, None, Attempts())
    finishing = asyncio.ensure_future(dispatcher.finish(sent, parsed, succeeded=True,
                                                        output_tokens=5, prompt_tokens=None))
    await state.entered.wait()
    finishing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await finishing
    assert state.in_flight() != {}  # still held: the finish waits for its gate
    state.gate.set()
    for _ in range(100):  # the shielded finish goes on: a few turns of the loop
        if not state.in_flight():
            break
        await asyncio.sleep(0)
    assert state.in_flight() == {}


async def test_a_refused_endpoint_is_marked_failed_and_the_request_goes_elsewhere() -> None:
    dispatcher, client, state, registry, _ = setup({A: "refuse"})
    attempts = Attempts()
    sent = await dispatcher.dispatch(parse_request(ApiPath.CHAT, BODY), None, attempts)
    assert [u.split("/v1")[0] for u in client.sent] == [A, B]
    assert attempts.failures == 1 and attempts.tried == {A, B}
    assert not registry.status(A).healthy and sent.plan.endpoint.url == B
    assert state.in_flight() == {B: state.in_flight()[B]}  # A's reservation was released


async def test_every_endpoint_refusing_is_a_502_with_nothing_held() -> None:
    dispatcher, _, state, _, _ = setup({A: "refuse", B: "refuse"})
    with pytest.raises(GatewayError) as info:
        await dispatcher.dispatch(parse_request(ApiPath.CHAT, BODY), None, Attempts())
    assert info.value.status == 502 and info.value.code == "upstream_unreachable"
    assert state.in_flight() == {}
    assert "http://" not in info.value.message and "refused" in (info.value.detail or "")


@pytest.mark.parametrize("status", ["999", "42"])
async def test_an_invalid_status_is_a_failed_endpoint_and_the_request_goes_elsewhere(
        status: str) -> None:
    dispatcher, client, state, registry, _ = setup({A: status})
    attempts = Attempts()
    sent = await dispatcher.dispatch(parse_request(ApiPath.CHAT, BODY), None, attempts)
    assert sent.plan.endpoint.url == B and sent.response.status == 200
    assert not registry.status(A).healthy and attempts.failures == 1
    assert set(state.in_flight()) == {B}


async def test_an_overloaded_engine_is_passed_over_while_retries_remain() -> None:
    dispatcher, client, state, registry, _ = setup({A: "503"})
    sent = await dispatcher.dispatch(parse_request(ApiPath.CHAT, BODY), None, Attempts())
    assert sent.plan.endpoint.url == B and registry.status(A).healthy  # busy, not down
    dispatcher, client, state, registry, _ = setup({A: "503", B: "503"})
    sent = await dispatcher.dispatch(parse_request(ApiPath.CHAT, BODY), None, Attempts())
    assert sent.response.status == 503 and len(client.sent) == 2  # the last one's 503 stands


async def test_no_response_in_time_is_a_504_with_nothing_held() -> None:
    dispatcher, _, state, _, _ = setup({A: "timeout"})
    with pytest.raises(GatewayError) as info:
        await dispatcher.dispatch(parse_request(ApiPath.CHAT, BODY), None, Attempts())
    assert info.value.status == 504 and state.in_flight() == {}
    assert info.value.message == "the engine did not answer in time"


@pytest.mark.parametrize(("body", "healthy", "status", "code"), [
    (b'{"model": "other", "prompt": "x"}', (A, B), 404, "model_not_found"),
    (b'{"model": "m", "prompt": "x"}', (), 503, "no_healthy_endpoint"),
])
async def test_unknown_model_and_no_healthy_endpoint(body: bytes, healthy: tuple[str, ...],
                                                     status: int, code: str) -> None:
    dispatcher, client, _, _, _ = setup(healthy=healthy)
    with pytest.raises(GatewayError) as info:
        await dispatcher.dispatch(parse_request(ApiPath.COMPLETIONS, body), None, Attempts())
    assert (info.value.status, info.value.code) == (status, code) and client.sent == []


async def test_a_completed_request_is_reported_to_its_endpoints_breaker() -> None:
    dispatcher, _, _, registry, _ = setup(healthy=(A,))
    for _ in range(2):
        registry.mark_failed(A, "refused")
        registry.record_poll(A, PollResult(registry.now(), healthy=True))
    parsed = parse_request(ApiPath.CHAT, BODY)
    sent = await dispatcher.dispatch(parsed, None, Attempts())
    assert sent.response.status == 200 and registry.status(A).request_failures == 2
    await dispatcher.finish(sent, parsed, succeeded=True, output_tokens=1, prompt_tokens=None)
    assert registry.status(A).request_failures == 0  # the 200, relayed whole, reset the count


async def test_an_engine_answering_200_then_breaking_its_streams_opens_its_breaker() -> None:
    dispatcher, _, _, registry, _ = setup(healthy=(A,))
    parsed = parse_request(ApiPath.CHAT, BODY)
    for _ in range(3):  # its health probe passes between the requests every time
        sent = await dispatcher.dispatch(parsed, None, Attempts())
        assert sent.response.status == 200
        dispatcher.engine_failed(sent, "the stream broke off")
        await dispatcher.finish(sent, parsed, succeeded=False, output_tokens=None,
                                prompt_tokens=None)
        registry.record_poll(A, PollResult(registry.now(), healthy=True))
    assert registry.status(A).circuit is CircuitState.OPEN and not registry.status(A).healthy
    with pytest.raises(GatewayError) as info:
        await dispatcher.dispatch(parsed, None, Attempts())
    assert info.value.code == "no_healthy_endpoint"


def admitted_setup(slo_ttft_s: float = 1.0) -> tuple[Dispatcher, MemoryState, Admission]:
    """One endpoint A whose engine figures give it a capacity of one request (0.9 × 1 ÷ 0.9),
    and admission control with a TTFT SLO of ``slo_ttft_s``."""
    fleet = fleet_of({"p": [A]})
    registry = EndpointRegistry(fleet)
    registry.record_poll(A, PollResult(registry.now(), True,
                                       EngineMetrics(running=1.0, waiting=0.0,
                                                     kv_cache_usage=0.9)))
    slos = SloPolicy({"m": ModelSlo(Bounds(ttft_s=slo_ttft_s))})
    admission = Admission(AdmissionConfig(recheck_s=30.0), slos, registry.snapshot)
    state = MemoryState()
    dispatcher = Dispatcher(registry, Client(), build_router(fleet), state, FeatureExtractor(),
                            retries=1, admission=admission)
    return dispatcher, state, admission


async def test_admission_holds_a_request_until_a_finished_one_frees_its_slot() -> None:
    dispatcher, state, admission = admitted_setup()
    parsed = parse_request(ApiPath.CHAT, BODY)
    earlier = await dispatcher.dispatch(parsed, None, Attempts())
    await dispatcher.finish(earlier, parsed, succeeded=True, output_tokens=5,
                            prompt_tokens=None)  # a slot freed once: the release rate is known
    first = await dispatcher.dispatch(parsed, None, Attempts())
    second = asyncio.create_task(dispatcher.dispatch(parsed, None, Attempts()))
    for _ in range(1000):
        if admission.waiting("p"):
            break
        await asyncio.sleep(0)
    assert admission.waiting("p") == 1 and state.in_flight()[A].requests == 1
    dispatcher.first_token(first, 0.2)
    await dispatcher.finish(first, parsed, succeeded=True, output_tokens=5, prompt_tokens=None)
    sent = await asyncio.wait_for(second, 10)
    assert sent.plan.endpoint.url == A and sent.waited_s > 0
    assert state.in_flight()[A].requests == 1


async def test_admission_refuses_with_a_503_and_retry_after_when_no_wait_can_meet_the_slo(
) -> None:
    dispatcher, state, admission = admitted_setup(slo_ttft_s=0.5)
    parsed = parse_request(ApiPath.CHAT, BODY)
    first = await dispatcher.dispatch(parsed, None, Attempts())
    dispatcher.first_token(first, 0.4)  # the engine alone takes 0.4 s: floor 0.4 + 2 × 0.2
    await dispatcher.finish(first, parsed, succeeded=True, output_tokens=5, prompt_tokens=None)
    await dispatcher.dispatch(parsed, None, Attempts())
    with pytest.raises(GatewayError) as info:
        await dispatcher.dispatch(parsed, None, Attempts())
    assert (info.value.status, info.value.code) == (503, "overloaded")
    assert dict(info.value.headers)[b"retry-after"] == b"1"
    assert state.in_flight()[A].requests == 1 and admission.waiting("p") == 0


STREAM = b'{"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}'


async def test_prefill_pacing_holds_a_stream_until_an_earlier_prompt_has_its_first_token(
) -> None:
    """Capacity is no limit here (0.9 × 1 ÷ 0.1 = 9 requests); prefill is. The first stream's
    first token 0.2 s after it was sent alone teaches a rate of T ÷ 0.2 = 5T tokens/s (T: one
    prompt), so the cap at SLO 1 s × target 0.5 is 2.5T: two prompts may be outstanding, the
    third waits until one of them has its first token."""
    fleet = fleet_of({"p": [A]})
    registry = EndpointRegistry(fleet)
    registry.record_poll(A, PollResult(registry.now(), True, EngineMetrics(
        running=1.0, waiting=0.0, kv_cache_usage=0.1)))
    slos = SloPolicy({"m": ModelSlo(Bounds(ttft_s=1.0))})
    admission = Admission(AdmissionConfig(recheck_s=30.0), slos, registry.snapshot)
    dispatcher = Dispatcher(registry, Client(), build_router(fleet), MemoryState(),
                            FeatureExtractor(), retries=1, admission=admission)
    parsed = parse_request(ApiPath.CHAT, STREAM)
    learn = await dispatcher.dispatch(parsed, None, Attempts())
    assert learn.prefill_ahead == learn.features.prompt_tokens > 0
    dispatcher.first_token(learn, 0.2)
    await dispatcher.finish(learn, parsed, succeeded=True, output_tokens=5, prompt_tokens=None)
    one = await dispatcher.dispatch(parsed, None, Attempts())
    two = await dispatcher.dispatch(parsed, None, Attempts())
    tokens = one.features.prompt_tokens
    assert (one.prefill_ahead, two.prefill_ahead) == (tokens, 2 * tokens)
    three = asyncio.create_task(dispatcher.dispatch(parsed, None, Attempts()))
    for _ in range(1000):
        if admission.waiting("p"):
            break
        await asyncio.sleep(0)
    assert admission.waiting("p") == 1 and not three.done()
    dispatcher.first_token(one, 0.3)  # one prompt's prefill done: room for the third
    sent = await asyncio.wait_for(three, 10)
    assert sent.waited_s > 0 and sent.prefill_ahead == 2 * tokens
    for done in (one, two, sent):  # ended without (another) first token: nothing outstanding
        await dispatcher.finish(done, parsed, succeeded=False, output_tokens=None,
                                prompt_tokens=None)
    assert await dispatcher.dispatch(parsed, None, Attempts()) is not None


@dataclass
class RecordingAdmission:
    """Stands in for :class:`Admission`: places at once, as if after a 0.25 s wait."""

    keys: list[str | None] = field(default_factory=list)
    releases: list[str] = field(default_factory=list)
    ttfts: list[tuple[str, float]] = field(default_factory=list)

    async def place(self, state: MemoryState, ask: Ask, route: Route
                    ) -> tuple[Placed[RoutePlan] | None, float]:
        self.keys.append(route.key)
        placed = await state.place(ask, lambda view: route.router.choose(
            route.features, route.pools, view, route.exclude))
        return placed, 0.25

    def released(self, url: str) -> None:
        self.releases.append(url)

    def observed_ttft(self, pool: str, engine_ttft_s: float) -> None:
        self.ttfts.append((pool, engine_ttft_s))


async def test_dispatch_tells_admission_the_key_releases_and_the_ttft_after_the_wait() -> None:
    fleet = fleet_of({"p": [A]})
    registry = EndpointRegistry(fleet)
    registry.record_poll(A, PollResult(registry.now(), healthy=True))
    fake = RecordingAdmission()
    dispatcher = Dispatcher(registry, Client(), build_router(fleet), MemoryState(),
                            FeatureExtractor(), retries=1, admission=cast(Admission, fake))
    body = b'{"model": "m", "user": "u1", "messages": [{"role": "user", "content": "hi"}]}'
    parsed = parse_request(ApiPath.CHAT, body)
    sent = await dispatcher.dispatch(parsed, None, Attempts())
    await dispatcher.dispatch(parsed, None, Attempts(), key="team-a")
    assert fake.keys == ["u1", "team-a"]  # no API key: the request's `user`
    assert sent.waited_s == 0.25
    dispatcher.first_token(sent, 1.0)
    await dispatcher.finish(sent, parsed, succeeded=True, output_tokens=5, prompt_tokens=None)
    assert fake.releases == [A] and fake.ttfts == [("p", 0.75)]


# -- the APIs that generate nothing, and the Responses API -------------------------------------

EMBED_BODY = b'{"model": "m", "input": ["one text", "another"]}'


async def test_an_embeddings_request_is_routed_by_load_alone() -> None:
    dispatcher, client, state, _, extractor = setup()
    parsed = parse_request(ApiPath.EMBEDDINGS, EMBED_BODY)
    first = await dispatcher.dispatch(parsed, "session-1", Attempts())
    second = await dispatcher.dispatch(parsed, "session-1", Attempts())
    assert extractor.calls == []  # no prompt is read: its size is all the router sees
    features = first.features
    assert (features.block_hashes, features.session, features.expected_output_tokens) == (
        (), None, 0)
    assert features.prompt_tokens == 12  # ⌈48 characters of body / 4⌉ (routing's estimate)
    assert (first.plan.decision.lever, first.plan.decision.reason) == ("none", "only_pool")
    assert client.sent == [A + "/v1/embeddings", B + "/v1/embeddings"]  # the less loaded
    assert state.in_flight()[A].requests == state.in_flight()[B].requests == 1
    for sent in (first, second):
        await dispatcher.finish(sent, parsed, succeeded=True, output_tokens=None,
                                prompt_tokens=4)
    assert state.in_flight() == {}


def pd_setup() -> tuple[Dispatcher, Client]:
    """A prefill pool (A) paired with a decode pool (B), both serving m."""
    facts = {"params": 1e9, "layers": 8, "hidden_size": 512, "kv_heads": 4, "head_dim": 64,
             "dtype_bytes": 2}
    hardware = {"name": "t", "peak_flops": 1e12, "mem_bandwidth": 1e11}
    fleet = parse_fleet({"pools": [
        {"name": "pre", "engine": "vllm", "models": ["m"], "endpoints": [A], "role": "prefill",
         "pair": "dec", "model": facts, "hardware": hardware},
        {"name": "dec", "engine": "vllm", "models": ["m"], "endpoints": [B], "role": "decode",
         "model": facts, "hardware": hardware}]})
    registry = EndpointRegistry(fleet)
    for url in (A, B):
        registry.record_poll(url, PollResult(registry.now(), healthy=True))
    client = Client()
    return Dispatcher(registry, client, build_router(fleet), MemoryState(), FeatureExtractor(),
                      retries=1), client


@pytest.mark.parametrize(("api_path", "body"), [
    (ApiPath.EMBEDDINGS, EMBED_BODY),
    (ApiPath.TOKENIZE, b'{"model": "m", "prompt": "x"}'),
    (ApiPath.RERANK, b'{"model": "m", "query": "q", "documents": ["d"]}'),
])
async def test_prefill_and_decode_engines_answer_them_directly(api_path: ApiPath,
                                                                body: bytes) -> None:
    dispatcher, client = pd_setup()
    sent = await dispatcher.dispatch(parse_request(api_path, body), None, Attempts())
    assert sent.handoff is None and sent.plan.prefill is None
    assert len(client.sent) == 1 and client.sent[0].endswith(api_path.value)


async def test_tokenize_teaches_the_router_state_nothing() -> None:
    dispatcher, _, state, _, _ = setup()
    for api_path, body in ((ApiPath.TOKENIZE, b'{"model": "m", "prompt": "some text"}'),
                           (ApiPath.EMBEDDINGS, EMBED_BODY)):
        parsed = parse_request(api_path, body)
        sent = await dispatcher.dispatch(parsed, None, Attempts())
        await dispatcher.finish(sent, parsed, succeeded=True, output_tokens=3,
                                prompt_tokens=5)
        taught = state.measures().overall.requests
        assert taught == (0 if api_path is ApiPath.TOKENIZE else 1)


async def test_a_responses_request_is_read_as_one_and_routed_by_the_lever_policy() -> None:
    dispatcher, client, _, _, extractor = setup()
    body = (b'{"model": "m", "instructions": "Be brief.", "input": "hi", '
            b'"max_output_tokens": 9}')
    sent = await dispatcher.dispatch(parse_request(ApiPath.RESPONSES, body), "s", Attempts())
    assert [(c.kind, c.max_tokens, c.session_hint) for c in extractor.calls] == [
        ("responses", 9, "s")]
    assert sent.features.session is not None and sent.features.expected_output_tokens == 9
    assert client.sent == [sent.plan.endpoint.url + "/v1/responses"]  # an idle tie: either


def test_probe_auth_sends_each_pools_engine_key_and_follows_the_fleet() -> None:
    keyed = fleet_of({"p": [A], "q": [B]})
    keyed = keyed.model_copy(update={"pools": [
        keyed.pools[0].model_copy(update={"api_key_env": "P_KEY"}), keyed.pools[1]]})
    current = [keyed]
    pools = {A: "p", B: "q"}
    auth = ProbeAuth(lambda: current[0], pools.get, {"P_KEY": "secret"})
    assert auth(A) == {"authorization": "Bearer secret"}
    assert auth(B) == {} and auth("http://gone:1") == {}
    current[0] = fleet_of({"p": [A], "q": [B]})  # reloaded without the key
    assert auth(A) == {}


def test_the_generation_apis_are_those_read_for_features() -> None:
    assert set(FEATURE_KINDS) == GENERATION


@dataclass
class BodyClient(Client):
    """Records the bodies sent."""

    bodies: list[bytes] = field(default_factory=list)

    async def send(self, url: str, body: bytes, headers: Mapping[str, str]) -> Response:
        self.bodies.append(body)
        return await super().send(url, body, headers)


@pytest.mark.parametrize(("engine", "sent_as"), [("sglang", "m:sql"), ("vllm", "sql")])
async def test_an_sglang_engine_gets_a_lora_adapter_as_base_colon_adapter(
        engine: str, sent_as: str) -> None:
    plain = fleet_of({"p": [A]}, engine=engine)
    fleet = plain.model_copy(update={"pools": [plain.pools[0].model_copy(update={
        "adapters": [Adapter(name="sql")]})]})
    registry = EndpointRegistry(fleet)
    registry.record_poll(A, PollResult(registry.now(), healthy=True))
    client = BodyClient()
    dispatcher = Dispatcher(registry, client, build_router(fleet), MemoryState(),
                            FeatureExtractor(), retries=1, model_names=engine_model_names(fleet))
    for model, expected in (("sql", sent_as), ("m", "m")):
        body = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}]}' % model.encode()
        await dispatcher.dispatch(parse_request(ApiPath.CHAT, body), None, Attempts())
        assert json.loads(client.bodies[-1])["model"] == expected


async def test_a_streams_prefill_counts_from_its_placement_and_leaves_with_a_failed_send(
) -> None:
    """The prefill is counted before the engine answers (a burst is placed whole before any
    does); an endpoint that refuses the connection keeps none of it, the one that serves it
    holds exactly its prompt."""
    fleet = fleet_of({"p": [A, B]})
    registry = EndpointRegistry(fleet)
    for url in (A, B):
        registry.record_poll(url, PollResult(registry.now(), True, EngineMetrics(
            running=1.0, waiting=0.0, kv_cache_usage=0.1)))
    admission = Admission(AdmissionConfig(recheck_s=30.0), SloPolicy(
        {"m": ModelSlo(Bounds(ttft_s=1.0))}), registry.snapshot)
    client = Client({A: "refuse"})
    dispatcher = Dispatcher(registry, client, build_router(fleet), MemoryState(),
                            FeatureExtractor(), retries=1, admission=admission)
    sent = await dispatcher.dispatch(parse_request(ApiPath.CHAT, STREAM), None, Attempts())
    assert [u.split("/v1")[0] for u in client.sent] == [A, B] and sent.plan.first.url == B
    assert sent.prefill_ahead == sent.features.prompt_tokens
    assert admission.prefill_started(A, 1) == 1  # nothing of the refused attempt left on A


async def test_a_streams_prefill_is_outstanding_while_its_engine_has_not_answered() -> None:
    fleet = fleet_of({"p": [A]})
    registry = EndpointRegistry(fleet)
    registry.record_poll(A, PollResult(registry.now(), True, EngineMetrics(
        running=1.0, waiting=0.0, kv_cache_usage=0.1)))
    admission = Admission(AdmissionConfig(recheck_s=30.0), SloPolicy(
        {"m": ModelSlo(Bounds(ttft_s=1.0))}), registry.snapshot)
    answer = asyncio.Event()

    class SlowClient(Client):
        async def send(self, url: str, body: bytes, headers: Mapping[str, str]) -> Response:
            await answer.wait()
            return await super().send(url, body, headers)

    dispatcher = Dispatcher(registry, SlowClient(), build_router(fleet), MemoryState(),
                            FeatureExtractor(), retries=1, admission=admission)
    task = asyncio.create_task(dispatcher.dispatch(parse_request(ApiPath.CHAT, STREAM), None,
                                                   Attempts()))
    for _ in range(100):  # the dispatch runs up to its send, which waits for ``answer``
        await asyncio.sleep(0)
    assert not task.done()
    probe = admission.prefill_started(A, 1)  # the outstanding prefill on A, with one token
    answer.set()
    sent = await asyncio.wait_for(task, 10)
    assert probe == sent.features.prompt_tokens + 1


class SetSnapshot:
    """A registry view whose snapshot the test sets (the endpoint registry's calls aside)."""

    def __init__(self, registry: EndpointRegistry) -> None:
        self.registry = registry
        self.pools = registry.snapshot()

    def snapshot(self) -> tuple[Any, ...]:
        return self.pools

    def mark_failed(self, url: str, reason: str) -> None:
        self.registry.mark_failed(url, reason)

    def mark_succeeded(self, url: str) -> None:
        self.registry.mark_succeeded(url)


async def test_the_endpoints_of_a_model_follow_the_registry_snapshot() -> None:
    fleet = fleet_of({"p": [A], "q": [B]}, models={"p": ["m"], "q": ["n"]})
    registry = EndpointRegistry(fleet)
    for url in (A, B):
        registry.record_poll(url, PollResult(registry.now(), healthy=True))
    view = SetSnapshot(registry)
    dispatcher = Dispatcher(view, Client(), build_router(fleet), MemoryState(),
                            FeatureExtractor(), retries=0)
    n_body = BODY.replace(b'"m"', b'"n"')
    sent = await dispatcher.dispatch(parse_request(ApiPath.CHAT, n_body), None, Attempts())
    assert sent.plan.endpoint.url == B
    p, q = view.pools
    view.pools = (p, q.replaced(models=("o",)))  # a new snapshot: q serves n no more
    with pytest.raises(GatewayError) as refused:
        await dispatcher.dispatch(parse_request(ApiPath.CHAT, n_body), None, Attempts())
    assert refused.value.status == 404
    view.pools = (p.replaced(models=("m", "n")), q)  # and now p does
    sent = await dispatcher.dispatch(parse_request(ApiPath.CHAT, n_body), None, Attempts())
    assert sent.plan.endpoint.url == A


async def test_the_endpoints_kept_per_model_stay_bounded() -> None:
    dispatcher, *_ = setup()
    for i in range(MAX_MODELS_KEPT + 10):
        body = BODY.replace(b'"m"', b'"unknown-%d"' % i)
        with pytest.raises(GatewayError):
            await dispatcher.dispatch(parse_request(ApiPath.CHAT, body), None, Attempts())
    assert len(dispatcher._urls) <= MAX_MODELS_KEPT
    sent = await dispatcher.dispatch(parse_request(ApiPath.CHAT, BODY), None, Attempts())
    assert sent.plan.endpoint.url in (A, B)
