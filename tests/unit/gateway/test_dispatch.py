"""Dispatch over a fake upstream: measure once, place through the state, send, release."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

import pytest

from backends.client import UpstreamConnectError, UpstreamTimeout
from backends.registry import CircuitState, EndpointRegistry, PollResult
from gateway.app import build_router
from gateway.dispatch import Attempts, Dispatcher
from gateway.errors import GatewayError
from gateway.openai_request import Endpoint, parse_request
from routing.features import FeatureExtractor, RequestFeatures, RequestInfo
from routing.memory_state import MemoryState
from routing.state import Outcome, Reservation
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
