"""Dispatch over a fake upstream: measure once, place through the state, send, release."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import cast

import pytest

from backends.client import UpstreamConnectError, UpstreamTimeout
from backends.registry import CircuitState, EndpointRegistry, PollResult
from gateway.admission import Admission, AdmissionConfig, Route
from gateway.app import build_router
from gateway.dispatch import Attempts, Dispatcher
from gateway.errors import GatewayError
from gateway.openai_request import Endpoint, parse_request
from gateway.slos import ModelSlo, SloPolicy
from routing.features import FeatureExtractor, RequestFeatures, RequestInfo
from routing.fleet_math import Bounds
from routing.memory_state import MemoryState
from routing.router import RoutePlan
from routing.snapshots import EngineMetrics
from routing.state import Ask, Outcome, Placed, Reservation
from tests.fakes.harness import fleet_of

A, B = "http://a:1", "http://b:1"
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'


@dataclass
class Response:
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    closed: bool = False

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


class CountingExtractor(FeatureExtractor):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[RequestInfo] = []

    def extract(self, payload: object, info: RequestInfo) -> RequestFeatures:
        self.calls.append(info)
        return super().extract(payload, info)  # type: ignore[arg-type]


def setup(modes: dict[str, str] | None = None, healthy: tuple[str, ...] = (A, B)
          ) -> tuple[Dispatcher, Client, MemoryState, EndpointRegistry, CountingExtractor]:
    fleet = fleet_of({"p": [A, B]})
    registry = EndpointRegistry(fleet)
    for url in healthy:
        registry.record_poll(url, PollResult(registry.now(), healthy=True))
    client, state, extractor = Client(modes or {}), MemoryState(), CountingExtractor()
    dispatcher = Dispatcher(registry, client, build_router(fleet), state, extractor, retries=1)
    return dispatcher, client, state, registry, extractor


async def test_a_request_is_measured_once_placed_and_released_on_finish() -> None:
    dispatcher, client, state, _, extractor = setup()
    await state.finish(Reservation("x", A, 0), Outcome("m", (), 10, 0, 77, None, True))
    parsed = parse_request(Endpoint.CHAT, BODY)
    sent = await dispatcher.dispatch(parsed, None, Attempts())
    assert len(extractor.calls) == 1 and extractor.calls[0].learned_output_tokens == 77
    assert sent.features.expected_output_tokens == 77  # learned: no max_tokens was given
    assert client.sent == [A + "/v1/chat/completions"] and sent.endpoint_index == 0
    assert state.in_flight()[A].requests == 1
    await dispatcher.finish(sent, parsed, succeeded=True, output_tokens=5, prompt_tokens=None)
    assert state.in_flight() == {} and isinstance(sent.response, Response)
    assert sent.response.closed


async def test_a_refused_endpoint_is_marked_failed_and_the_request_goes_elsewhere() -> None:
    dispatcher, client, state, registry, _ = setup({A: "refuse"})
    attempts = Attempts()
    sent = await dispatcher.dispatch(parse_request(Endpoint.CHAT, BODY), None, attempts)
    assert [u.split("/v1")[0] for u in client.sent] == [A, B]
    assert attempts.failures == 1 and attempts.tried == {A, B}
    assert not registry.status(A).healthy and sent.plan.endpoint.url == B
    assert state.in_flight() == {B: state.in_flight()[B]}  # A's reservation was released


async def test_every_endpoint_refusing_is_a_502_with_nothing_held() -> None:
    dispatcher, _, state, _, _ = setup({A: "refuse", B: "refuse"})
    with pytest.raises(GatewayError) as info:
        await dispatcher.dispatch(parse_request(Endpoint.CHAT, BODY), None, Attempts())
    assert info.value.status == 502 and info.value.code == "upstream_unreachable"
    assert state.in_flight() == {}
    assert "http://" not in info.value.message and "refused" in (info.value.detail or "")


@pytest.mark.parametrize("status", ["999", "42"])
async def test_an_invalid_status_is_a_failed_endpoint_and_the_request_goes_elsewhere(
        status: str) -> None:
    dispatcher, client, state, registry, _ = setup({A: status})
    attempts = Attempts()
    sent = await dispatcher.dispatch(parse_request(Endpoint.CHAT, BODY), None, attempts)
    assert sent.plan.endpoint.url == B and sent.response.status == 200
    assert not registry.status(A).healthy and attempts.failures == 1
    assert set(state.in_flight()) == {B}


async def test_an_overloaded_engine_is_passed_over_while_retries_remain() -> None:
    dispatcher, client, state, registry, _ = setup({A: "503"})
    sent = await dispatcher.dispatch(parse_request(Endpoint.CHAT, BODY), None, Attempts())
    assert sent.plan.endpoint.url == B and registry.status(A).healthy  # busy, not down
    dispatcher, client, state, registry, _ = setup({A: "503", B: "503"})
    sent = await dispatcher.dispatch(parse_request(Endpoint.CHAT, BODY), None, Attempts())
    assert sent.response.status == 503 and len(client.sent) == 2  # the last one's 503 stands


async def test_no_response_in_time_is_a_504_with_nothing_held() -> None:
    dispatcher, _, state, _, _ = setup({A: "timeout"})
    with pytest.raises(GatewayError) as info:
        await dispatcher.dispatch(parse_request(Endpoint.CHAT, BODY), None, Attempts())
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
        await dispatcher.dispatch(parse_request(Endpoint.COMPLETIONS, body), None, Attempts())
    assert (info.value.status, info.value.code) == (status, code) and client.sent == []


async def test_a_completed_request_is_reported_to_its_endpoints_breaker() -> None:
    dispatcher, _, _, registry, _ = setup(healthy=(A,))
    for _ in range(2):
        registry.mark_failed(A, "refused")
        registry.record_poll(A, PollResult(registry.now(), healthy=True))
    parsed = parse_request(Endpoint.CHAT, BODY)
    sent = await dispatcher.dispatch(parsed, None, Attempts())
    assert sent.response.status == 200 and registry.status(A).request_failures == 2
    await dispatcher.finish(sent, parsed, succeeded=True, output_tokens=1, prompt_tokens=None)
    assert registry.status(A).request_failures == 0  # the 200, relayed whole, reset the count


async def test_an_engine_answering_200_then_breaking_its_streams_opens_its_breaker() -> None:
    dispatcher, _, _, registry, _ = setup(healthy=(A,))
    parsed = parse_request(Endpoint.CHAT, BODY)
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
    parsed = parse_request(Endpoint.CHAT, BODY)
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
    await dispatcher.finish(first, parsed, succeeded=True, output_tokens=5, prompt_tokens=None,
                            ttft_s=0.2)
    sent = await asyncio.wait_for(second, 10)
    assert sent.plan.endpoint.url == A and sent.waited_s > 0
    assert state.in_flight()[A].requests == 1


async def test_admission_refuses_with_a_503_and_retry_after_when_no_wait_can_meet_the_slo(
) -> None:
    dispatcher, state, admission = admitted_setup(slo_ttft_s=0.5)
    parsed = parse_request(Endpoint.CHAT, BODY)
    first = await dispatcher.dispatch(parsed, None, Attempts())
    await dispatcher.finish(first, parsed, succeeded=True, output_tokens=5, prompt_tokens=None,
                            ttft_s=0.4)  # the engine alone takes 0.4 s: floor 0.4 + 2 × 0.2
    await dispatcher.dispatch(parsed, None, Attempts())
    with pytest.raises(GatewayError) as info:
        await dispatcher.dispatch(parsed, None, Attempts())
    assert (info.value.status, info.value.code) == (503, "overloaded")
    assert dict(info.value.headers)[b"retry-after"] == b"1"
    assert state.in_flight()[A].requests == 1 and admission.waiting("p") == 0


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
    parsed = parse_request(Endpoint.CHAT, body)
    sent = await dispatcher.dispatch(parsed, None, Attempts())
    await dispatcher.dispatch(parsed, None, Attempts(), key="team-a")
    assert fake.keys == ["u1", "team-a"]  # no API key: the request's `user`
    assert sent.waited_s == 0.25
    await dispatcher.finish(sent, parsed, succeeded=True, output_tokens=5, prompt_tokens=None,
                            ttft_s=1.0)
    assert fake.releases == [A] and fake.ttfts == [("p", 0.75)]
