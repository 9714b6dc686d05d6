"""The load driver against a fake OpenAI server on a free port: stream reading, request
bodies, history, bounds, drain and stop. No timing claims."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from ridge_bench.harness.driver import Bounds, Destination, StreamReader, request_body, run_workload
from ridge_bench.harness.turns import Dispatcher
from ridge_bench.harness.workloads import Conversation, LoadStep, Turn, Workload


@dataclass(frozen=True)
class TwoTurns:
    kind: str = "agent"

    def conversation(self, index: int) -> Conversation:
        return Conversation(f"c{index}", self.kind, ({"role": "system", "content": "S"},),
                            (Turn(f"ask {index}", 3), Turn(f"more {index}", 2)))


@dataclass
class FakeEngine:
    """Streams ``max_tokens`` one-word chunks; "hang" in the last message never ends."""

    bodies: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    aborted: int = 0

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        if self.status != 200:
            return web.json_response({"error": {"message": "no"}}, status=self.status)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream",
                                           "x-ridge-route": "pool=radix; lever=prefix_cache",
                                           "x-ridge-endpoint": "2"})
        await resp.prepare(request)
        if "hang" in body["messages"][-1]["content"]:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:  # the client closed the connection
                self.aborted += 1
                raise
        await resp.write(_event({"choices": [{"delta": {"role": "assistant", "content": ""}}]}))
        for i in range(body["max_tokens"]):
            await resp.write(_event({"choices": [{"delta": {"content": f" w{i}"}}]}))
        await resp.write(_event({"choices": [], "usage": {
            "prompt_tokens": 7, "completion_tokens": body["max_tokens"],
            "prompt_tokens_details": {"cached_tokens": 4}}}))
        await resp.write(b"data: [DONE]\n\n")
        return resp


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


@pytest.fixture
async def engine() -> AsyncIterator[tuple[FakeEngine, str]]:
    fake = FakeEngine()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake.chat)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield fake, f"http://127.0.0.1:{port}"
    await runner.cleanup()


def _workload(rate: float = 500.0, duration_s: float = 5.0) -> Workload:
    return Workload("t", 0, {"agent": TwoTurns()}, {"agent": 1.0},
                    (LoadStep(rate, duration_s),))


def test_stream_reader_folds_content_usage_and_done() -> None:
    times = iter([1.0, 2.0, 3.0])
    reader = StreamReader(lambda: next(times))
    events = [{"choices": [{"delta": {"content": ""}}]},
              {"choices": [{"delta": {"content": "Hi"}}]},
              {"choices": [{"delta": {"content": " there"}}]},
              {"choices": [], "usage": {"completion_tokens": 2}}]
    reader.feed(b": comment")
    for event in events:
        reader.feed(b"data: " + json.dumps(event).encode())
    reader.feed(b"data: [DONE]")
    assert reader.first_content_at == 1.0  # the empty role chunk does not count
    assert reader.text == "Hi there" and reader.usage["completion_tokens"] == 2
    assert reader.done and reader.error is None


def test_stream_reader_reports_an_error_event() -> None:
    reader = StreamReader(lambda: 0.0)
    reader.feed(b'data: {"error": {"message": "broke", "code": "upstream_broken"}}')
    assert reader.error == "stream error upstream_broken"


def test_request_body_streams_with_usage_a_fixed_seed_and_exact_length() -> None:
    d = Dispatcher({"agent": TwoTurns()})
    pending = d.take("agent")
    body = request_body(Destination("http://x", "m"), pending)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 3 and body["ignore_eos"] is True and body["model"] == "m"
    turns = Dispatcher({"agent": TwoTurns()})
    again = request_body(Destination("http://x", "m"), turns.take("agent"))
    assert again["seed"] == body["seed"]
    assert "ignore_eos" not in request_body(Destination("http://x", "m", ignore_eos=False), pending)


async def test_a_run_sends_turns_with_history_and_measures_them(
        engine: tuple[FakeEngine, str]) -> None:
    fake, url = engine
    data = await run_workload(_workload(), Destination(url, "m"), Bounds(8, 5.0, 5.0))
    assert len(data.results) == 8 and all(r.ok for r in data.results)
    assert not data.interrupted and 0 < data.window_s <= 5.0
    r = data.results[0]
    assert r.route.pool == "radix" and r.prompt_tokens == 7 and r.cached_tokens == 4
    assert all(r.endpoint == "2" for r in data.results)
    keys = sorted(r.key for r in data.results)
    assert len(set(keys)) == 8 and all(k.startswith("c") and k[-2:] in (":0", ":1") for k in keys)
    assert {k[:-2] for k in keys if k.endswith(":1")} <= {k[:-2] for k in keys if k.endswith(":0")}
    assert r.ttft_s is not None and r.e2e_s is not None and r.e2e_s >= r.ttft_s
    second_turns = [b for b in fake.bodies if len(b["messages"]) == 4]
    for body in second_turns:
        n = body["messages"][1]["content"].split()[-1]
        assert body["messages"][2] == {"role": "assistant", "content": " w0 w1 w2"}
        assert body["messages"][3]["content"] == f"more {n}"
    assert sum(r.output_tokens for r in data.results) == sum(b["max_tokens"] for b in fake.bodies)


async def test_http_errors_are_counted_and_end_the_conversation(
        engine: tuple[FakeEngine, str]) -> None:
    fake, url = engine
    fake.status = 503
    data = await run_workload(_workload(), Destination(url, "m"), Bounds(4, 5.0, 5.0))
    assert [r.error for r in data.results] == ["HTTP 503"] * 4
    assert all(r.e2e_s is not None and r.e2e_s >= 0 for r in data.results)  # refusal latency
    assert all(len(b["messages"]) == 2 for b in fake.bodies)  # no second turn ever


async def test_requests_still_running_after_the_drain_are_cancelled(
        engine: tuple[FakeEngine, str]) -> None:
    fake, url = engine

    @dataclass(frozen=True)
    class Hangs:
        kind: str = "agent"

        def conversation(self, index: int) -> Conversation:
            return Conversation(f"h{index}", self.kind, (), (Turn("hang", 2),))

    wl = Workload("h", 0, {"agent": Hangs()}, {"agent": 1.0}, (LoadStep(500.0, 5.0),))
    data = await run_workload(wl, Destination(url, "m"), Bounds(3, 5.0, 0.2))
    assert [r.error for r in data.results] == ["unfinished"] * 3
    assert all(r.route.pool == "radix" for r in data.results)  # headers had arrived
    for _ in range(100):  # the server sees the closed connections soon after
        if fake.aborted == 3:
            break
        await asyncio.sleep(0.01)
    assert fake.aborted == 3


async def test_a_stop_before_the_start_sends_nothing(engine: tuple[FakeEngine, str]) -> None:
    fake, url = engine
    stop = asyncio.Event()
    stop.set()
    data = await run_workload(_workload(rate=1.0), Destination(url, "m"), Bounds(5, 60.0, 5.0),
                              stop=stop)
    assert data.interrupted and data.results == [] and fake.bodies == []


async def test_the_duration_bound_ends_the_window(engine: tuple[FakeEngine, str]) -> None:
    _, url = engine
    data = await run_workload(_workload(rate=1e-6, duration_s=0.3), Destination(url, "m"),
                              Bounds(5, 0.3, 1.0))
    assert data.results == [] and data.window_s == pytest.approx(0.3)
