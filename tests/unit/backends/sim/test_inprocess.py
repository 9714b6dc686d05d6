"""backends.sim.inprocess: the simulated engines reached by URL without HTTP, on virtual time."""

from __future__ import annotations

import json

import pytest

from backends.engines.dialects import dialect_for
from backends.engines.probe import ProbeError
from backends.sim.clock import LoopClock
from backends.sim.inprocess import InProcessFleet, start_in_process
from backends.sim.virtual_loop import run
from backends.upstream.client import UpstreamConnectError
from config.fleet import FleetConfigError, parse_fleet

URL = "http://127.0.0.1:9001"
FLEET = parse_fleet({"pools": [{"name": "p", "engine": "vllm", "models": ["m"],
                                "endpoints": [URL, "http://127.0.0.1:9002"],
                                "levers": {"prefix_caching": True},
                                "model": "llama-3-8b", "hardware": "nvidia-l4"}]})
CHAT = URL + "/v1/chat/completions"


def _body(stream: bool, tokens: int = 5, **more: object) -> bytes:
    return json.dumps({"model": "m", "stream": stream, "max_tokens": tokens, "ignore_eos": True,
                       "messages": [{"role": "user", "content": "hello " * 50}],
                       **more}).encode()


def _events(raw: bytes) -> list[str]:
    return [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]


async def _fleet(coalesce: bool = False) -> InProcessFleet:
    return start_in_process(FLEET, seed=1, clock=LoopClock(), coalesce=coalesce)


def test_a_whole_answer_and_a_stream_are_the_engines_own() -> None:
    async def main() -> tuple[dict[str, object], list[str], float]:
        fleet = await _fleet()
        client = fleet.client()
        whole = await client.send(CHAT, _body(False), {})
        assert whole.status == 200 and whole.headers["content-type"] == "application/json"
        answer = json.loads(await whole.read())
        start = fleet.clock.now()
        stream = await client.send(CHAT, _body(True, stream_options={"include_usage": True}),
                                   {})
        assert stream.headers["content-type"].startswith("text/event-stream")
        events = _events(b"".join([c async for c in stream.chunks()]))
        took = fleet.clock.now() - start
        await fleet.stop()
        return answer, events, took

    answer, events, took = run(main())
    assert answer["usage"]["completion_tokens"] == 5  # type: ignore[index]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["usage"]["completion_tokens"] == 5
    assert len(events) == 1 + 5 + 1 + 1  # the role, a token a step, the usage, DONE
    assert took > 0  # the engine's steps took virtual time


def test_a_coalesced_stream_is_its_first_step_then_the_rest() -> None:
    async def main() -> list[str]:
        fleet = await _fleet(coalesce=True)
        stream = await fleet.client().send(CHAT, _body(True, 20), {})
        events = _events(b"".join([c async for c in stream.chunks()]))
        await fleet.stop()
        return events

    events = run(main())
    texts = [json.loads(e)["choices"][0]["delta"].get("content") for e in events[:-1]]
    assert len(events) == 4 and not texts[0]  # the role, the first token, the rest, DONE
    assert json.loads(events[2])["choices"][0]["finish_reason"] == "length"


def test_bad_requests_unknown_paths_and_unknown_engines() -> None:
    async def main() -> tuple[int, int]:
        fleet = await _fleet()
        client = fleet.client()
        bad = await client.send(CHAT, b"{not json", {})
        missing = await client.send(URL + "/v1/nothing", b"{}", {})
        with pytest.raises(UpstreamConnectError):
            await client.send("http://127.0.0.1:1/v1/chat/completions", _body(False), {})
        await fleet.stop()
        return bad.status, missing.status

    assert run(main()) == (400, 404)


def test_closing_a_stream_early_aborts_its_request() -> None:
    async def main() -> tuple[int, int]:
        fleet = await _fleet()
        stream = await fleet.client().send(CHAT, _body(True, 500), {})
        chunks = stream.chunks()
        await anext(chunks)
        engine = fleet.endpoint(URL)
        running = engine.core.num_running + engine.core.num_waiting
        await stream.close()
        left = engine.core.num_running + engine.core.num_waiting
        await fleet.stop()
        return running, left

    assert run(main()) == (1, 0)


def test_the_probe_reads_the_pages_the_server_would_answer() -> None:
    async def main() -> None:
        fleet = await _fleet()
        probe, vllm = fleet.probe(), dialect_for("vllm")
        assert await probe.health(URL, vllm)
        metrics = await probe.metrics(URL, vllm)
        assert metrics.running == 0
        facts = await probe.facts(URL, vllm)
        assert facts["prefix_cache"] is True and facts["max_context"] == 8192
        with pytest.raises(ProbeError):
            await probe.metrics("http://127.0.0.1:1", vllm)
        await fleet.stop()

    run(main())


def test_kv_events_need_sockets() -> None:
    raw = {"name": "p", "engine": "vllm", "models": ["m"], "endpoints": [URL],
           "levers": {"prefix_caching": True}, "kv_events": {"port": 5557},
           "model": "llama-3-8b", "hardware": "nvidia-l4"}

    async def main() -> None:
        with pytest.raises(FleetConfigError, match="kv_events"):
            start_in_process(parse_fleet({"pools": [raw]}), clock=LoopClock())

    run(main())
