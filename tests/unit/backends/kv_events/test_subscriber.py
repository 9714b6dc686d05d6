"""backends.kv_events.subscriber against real ZMQ sockets on 127.0.0.1: a fake engine publishes with
vLLM's framing (``(topic, seq, payload)`` on the publish socket, vLLM's replay protocol on a
ROUTER, or earlier SGLang's without the topic frame) and payloads from
:class:`backends.kv_events.wire.Codec` (or SGLang's codec); the subscribers apply,
replay, reset and skip as the module says. The publish socket is an XPUB, vLLM's PUB that
also reports subscriptions, so a test can wait until a subscriber is there instead of losing
its first batches to ZMQ's slow joiner. Conditions are polled with generous deadlines."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, cast

import pytest
import zmq
import zmq.asyncio

from backends.kv_events.subscriber import KvEventSubscribers, SubscriberSettings, wanted_sources
from backends.kv_events.wire import END_SEQ, Codec, EventCodec, SglangCodec, seq_bytes
from config.fleet import parse_fleet
from config.kv_events import KvEventSource
from routing.kv_events.events import AllCleared, BlocksRemoved, BlocksStored, KvEvent

TOPIC = "kv@test"
DEADLINE_S = 30.0


class Sink:
    """Records every call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, list[KvEvent]]] = []

    def apply(self, endpoint: str, events: Sequence[KvEvent]) -> None:
        self.calls.append(("apply", endpoint, list(events)))

    def reset(self, endpoint: str) -> None:
        self.calls.append(("reset", endpoint, []))

    def batches(self, endpoint: str) -> list[int]:
        """The numbers of the batches of :func:`batch` applied for ``endpoint`` (each stores
        one block whose hash is its number)."""
        return [cast(int, events[0].block_hashes[0]) for kind, e, events in self.calls
                if kind == "apply" and e == endpoint and isinstance(events[0], BlocksStored)]

    def resets(self, endpoint: str) -> int:
        return sum(1 for kind, e, _ in self.calls if kind == "reset" and e == endpoint)


def batch(n: int) -> list[KvEvent]:
    return [BlocksStored([n], None, [n, n + 1], 2)]


class Engine:
    """vLLM's publisher, by hand: an XPUB and a ROUTER on 127.0.0.1 ports of the system's
    choice, a replay buffer, and seq numbers the test chooses."""

    def __init__(self, context: zmq.asyncio.Context, replay: bool = True,
                 codec: EventCodec | None = None, bare: bool = False) -> None:
        self.bare = bare  # replay as earlier SGLang: no topic frame
        self.pub = context.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind("tcp://127.0.0.1:0")
        self.router: zmq.asyncio.Socket | None = None
        self.buffer: list[tuple[int, bytes]] = []
        self.codec: EventCodec = Codec() if codec is None else codec
        self._task: asyncio.Task[None] | None = None
        if replay:
            self.router = context.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            self.router.bind("tcp://127.0.0.1:0")
            self._task = asyncio.get_running_loop().create_task(self._serve_replays())

    def source(self) -> KvEventSource:
        replay = None if self.router is None else _endpoint(self.router)
        return KvEventSource(_endpoint(self.pub), replay, TOPIC)

    def publish(self, seq: int, payload: bytes | None = None, live: bool = True) -> None:
        """Batch ``seq`` (its events from :func:`batch`, or ``payload``) into the replay buffer
        and, if ``live``, onto the publish socket."""
        body = self.codec.encode(time.time(), batch(seq)) if payload is None else payload
        self.buffer.append((seq, body))
        if live:
            self.pub.send_multipart([TOPIC.encode(), seq.to_bytes(8, "big"), body])

    async def subscribed(self) -> None:
        """Wait for a subscription to the topic (XPUB: b"\\x01" + topic)."""
        await self._await_message(b"\x01" + TOPIC.encode())

    async def unsubscribed(self) -> None:
        """Wait until the subscriber's socket is gone (XPUB: b"\\x00" + topic)."""
        await self._await_message(b"\x00" + TOPIC.encode())

    async def _await_message(self, wanted: bytes) -> None:
        async with asyncio.timeout(DEADLINE_S):
            while await self.pub.recv() != wanted:
                pass

    async def _serve_replays(self) -> None:
        """As ``ZmqEventPublisher._service_replay``: every buffered batch from the asked seq on,
        then the end marker."""
        assert self.router is not None
        while True:
            client, _, start = await self.router.recv_multipart()
            topic = [] if self.bare else [TOPIC.encode()]
            for seq, body in list(self.buffer):
                if seq >= int.from_bytes(start, "big"):
                    await self.router.send_multipart(
                        [client, b"", *topic, seq.to_bytes(8, "big"), body])
            await self.router.send_multipart([client, b"", *(topic and [b""]), END_SEQ, b""])

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])
        self.pub.close(linger=0)
        if self.router is not None:
            self.router.close(linger=0)


def _endpoint(sock: zmq.asyncio.Socket) -> str:
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


async def until(condition: Callable[[], bool], what: str = "condition") -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.fixture
async def context() -> AsyncIterator[zmq.asyncio.Context]:
    ctx = zmq.asyncio.Context()
    yield ctx
    ctx.destroy(linger=0)


@contextlib.asynccontextmanager
async def running(sink: Sink, context: zmq.asyncio.Context,
                  **settings: Any) -> AsyncIterator[KvEventSubscribers]:
    manager = KvEventSubscribers(sink, SubscriberSettings(**settings), context=context)
    try:
        yield manager
    finally:
        await manager.aclose()


URL = "http://127.0.0.1:8001"


async def test_batches_buffered_before_and_published_after_start_arrive_once_in_order(
        context: zmq.asyncio.Context) -> None:
    engine, sink = Engine(context), Sink()
    engine.publish(0, live=False)  # published before the gateway started: only replay has it
    engine.publish(1, live=False)
    async with running(sink, context) as manager:
        await manager.sync({URL: engine.source()})
        await engine.subscribed()
        await until(lambda: sink.batches(URL) == [0, 1], "the initial replay")
        for seq in (2, 3):
            engine.publish(seq)
        await until(lambda: len(sink.batches(URL)) >= 4, "live batches")
        assert sink.batches(URL) == [0, 1, 2, 3]
        counters = manager.counters()[URL]
        assert (counters.batches_applied, counters.events_applied) == (4, 4)
        assert counters.resets == 0 and counters.decode_errors == 0 and counters.replays >= 1
        assert counters.last_seq == 3 and manager.sources() == {URL: engine.source()}
    await engine.close()


async def test_a_gap_is_filled_from_the_replay_socket(context: zmq.asyncio.Context) -> None:
    engine, sink = Engine(context), Sink()
    async with running(sink, context) as manager:
        await manager.sync({URL: engine.source()})
        await engine.subscribed()
        engine.publish(0)
        await until(lambda: sink.batches(URL) == [0], "batch 0")
        replays = manager.counters()[URL].replays
        engine.publish(1, live=False)  # lost on the way
        engine.publish(2)
        engine.publish(3)
        await until(lambda: len(sink.batches(URL)) >= 4, "the gap filled")
        assert sink.batches(URL) == [0, 1, 2, 3]  # each once: live 2 and 3 after the replay
        counters = manager.counters()[URL]
        assert counters.replays > replays and counters.resets == 0 and sink.resets(URL) == 0
    await engine.close()


async def test_an_engine_restart_resets_the_endpoint(context: zmq.asyncio.Context) -> None:
    engine, sink = Engine(context, replay=False), Sink()
    async with running(sink, context) as manager:
        await manager.sync({URL: engine.source()})
        await engine.subscribed()
        for seq in (0, 1, 2):
            engine.publish(seq)
        await until(lambda: len(sink.batches(URL)) == 3, "three batches")
        engine.publish(0, engine.codec.encode(time.time(), [AllCleared()]))  # counts from 0
        engine.publish(1)
        await until(lambda: sink.batches(URL)[-1:] == [1] and len(sink.calls) == 6, "restart")
        kinds = [kind for kind, _, _ in sink.calls]
        assert kinds == ["apply"] * 3 + ["reset", "apply", "apply"]
        assert sink.calls[4][2] == [AllCleared()]
        assert manager.counters()[URL].resets == 1
    await engine.close()


async def test_a_gap_without_replay_resets_then_goes_on(context: zmq.asyncio.Context) -> None:
    engine, sink = Engine(context, replay=False), Sink()
    async with running(sink, context) as manager:
        await manager.sync({URL: engine.source()})
        await engine.subscribed()
        engine.publish(5)  # joining a running engine: no reset, nothing was known
        engine.publish(6)
        await until(lambda: sink.batches(URL) == [5, 6], "the first batches")
        assert sink.resets(URL) == 0
        engine.publish(8)  # 7 lost, and no replay socket to ask
        await until(lambda: sink.batches(URL) == [5, 6, 8], "the batch after the gap")
        assert [k for k, _, _ in sink.calls] == ["apply", "apply", "reset", "apply"]
        assert manager.counters()[URL].resets == 1
    await engine.close()


async def test_a_replay_that_starts_after_the_missing_batch_resets(
        context: zmq.asyncio.Context) -> None:
    engine, sink = Engine(context), Sink()
    async with running(sink, context) as manager:
        await manager.sync({URL: engine.source()})
        await engine.subscribed()
        engine.publish(0)
        await until(lambda: sink.batches(URL) == [0], "batch 0")
        engine.publish(1, live=False)
        engine.publish(2, live=False)
        engine.buffer = [b for b in engine.buffer if b[0] != 1]  # the buffer has moved on
        engine.publish(3)
        await until(lambda: sink.batches(URL)[-2:] == [2, 3], "the batches after the gap")
        assert sink.batches(URL) == [0, 2, 3]
        assert [k for k, _, _ in sink.calls] == ["apply", "reset", "apply", "apply"]
    await engine.close()


async def test_a_replay_socket_that_does_not_answer_counts_as_a_gap(
        context: zmq.asyncio.Context) -> None:
    engine, silent, sink = Engine(context, replay=False), context.socket(zmq.ROUTER), Sink()
    silent.bind("tcp://127.0.0.1:0")  # takes requests, never answers
    source = engine.source()._replace(replay=_endpoint(silent))
    async with running(sink, context, replay_timeout_s=0.2) as manager:
        await manager.sync({URL: source})
        await engine.subscribed()
        engine.publish(0)
        await until(lambda: sink.batches(URL) == [0], "batch 0")
        engine.publish(2)
        await until(lambda: sink.batches(URL) == [0, 2], "the batch after the gap")
        assert sink.resets(URL) == 1 and manager.counters()[URL].replays >= 2
    silent.close(linger=0)
    await engine.close()


async def test_malformed_messages_are_counted_and_skipped(context: zmq.asyncio.Context) -> None:
    engine, sink = Engine(context), Sink()
    async with running(sink, context) as manager:
        await manager.sync({URL: engine.source()})
        await engine.subscribed()
        engine.publish(0)
        engine.publish(1, b"\xc1 not a batch")  # 0xc1: never valid msgpack
        engine.publish(2, Codec().encode(0.0, [BlocksRemoved([b"x"])])[:-2])  # cut short
        engine.pub.send_multipart([TOPIC.encode(), b"\x00\x03"])  # two frames, short seq
        engine.publish(3)
        await until(lambda: sink.batches(URL)[-1:] == [3], "batch 3")
        assert sink.batches(URL) == [0, 3] and sink.resets(URL) == 0
        counters = manager.counters()[URL]
        assert counters.decode_errors == 3 and counters.batches_applied == 2
    await engine.close()


async def test_other_topics_sharing_the_prefix_are_ignored(context: zmq.asyncio.Context) -> None:
    engine, sink = Engine(context, replay=False), Sink()
    async with running(sink, context) as manager:
        await manager.sync({URL: engine.source()})
        await engine.subscribed()
        body = engine.codec.encode(0.0, batch(9))
        engine.pub.send_multipart([(TOPIC + "-other").encode(), seq_bytes(0), body])
        engine.publish(0)
        await until(lambda: sink.batches(URL) == [0], "batch 0")
        assert manager.counters()[URL].decode_errors == 0
    await engine.close()


async def test_sync_starts_and_stops_subscribers(context: zmq.asyncio.Context) -> None:
    one, two, sink = Engine(context), Engine(context, replay=False), Sink()
    url_two = "http://127.0.0.2:8001"
    async with running(sink, context) as manager:
        await manager.sync({URL: one.source()})
        await one.subscribed()
        await manager.sync({URL: one.source(), url_two: two.source()})  # one keeps running
        await two.subscribed()
        one.publish(0)
        two.publish(0)
        await until(lambda: sink.batches(URL) == [0] and sink.batches(url_two) == [0], "both")
        assert set(manager.counters()) == {URL, url_two}
        await manager.sync({url_two: two.source()})
        await one.unsubscribed()  # its socket is closed
        assert sink.resets(URL) == 1 and sink.resets(url_two) == 0  # what it knew goes stale
        assert set(manager.counters()) == {url_two}
        await manager.sync({url_two: two.source()})  # the same stream: nothing restarts
        assert sink.resets(url_two) == 0
        moved = two.source()._replace(topic="elsewhere")  # another stream: a new subscriber
        await manager.sync({url_two: moved})
        assert sink.resets(url_two) == 1 and manager.sources() == {url_two: moved}
    await one.close()
    await two.close()


async def test_aclose_ends_every_task_and_socket(context: zmq.asyncio.Context) -> None:
    engine, sink = Engine(context), Sink()
    manager = KvEventSubscribers(sink, context=context)
    await manager.sync({URL: engine.source()})
    await engine.subscribed()
    engine.publish(0)
    await until(lambda: sink.batches(URL) == [0], "batch 0")
    tasks = [t for t in asyncio.all_tasks() if t.get_name().startswith("kv-events")]
    assert tasks
    await manager.aclose()
    await engine.unsubscribed()
    assert all(t.done() for t in tasks) and manager.counters() == {}
    assert sink.resets(URL) == 0  # closing keeps what the sink learned
    await manager.aclose()  # twice is fine
    with pytest.raises(RuntimeError, match="closed"):
        await manager.sync({})
    await engine.close()


async def test_a_manager_with_a_context_of_its_own() -> None:
    manager = KvEventSubscribers(Sink())
    await manager.sync({URL: KvEventSource("tcp://127.0.0.1:9", None, "")})  # nobody there
    assert set(manager.sources()) == {URL}
    await manager.aclose()
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("kv-events")]


def test_the_wanted_streams_of_a_fleet() -> None:
    def pool(name: str, urls: list[str], **more: Any) -> dict[str, Any]:
        return {"name": name, "engine": "vllm", "models": [name], "endpoints": urls, **more}
    fleet = parse_fleet({"pools": [
        pool("a", ["http://a:8000"], levers={"prefix_caching": True},
             kv_events={"port": 5557, "topic": "t"}),
        pool("b", ["http://b:8000"], resolve="dns", levers={"prefix_caching": True},
             kv_events={"port": 5557, "replay_port": 5558}),
        pool("c", ["http://c:8000"])]})  # fmt: skip
    wanted = wanted_sources(fleet.pools, {"b": ["http://10.0.0.7:8000"]})
    assert wanted == {
        "http://a:8000": KvEventSource("tcp://a:5557", None, "t"),
        "http://10.0.0.7:8000": KvEventSource("tcp://10.0.0.7:5557", "tcp://10.0.0.7:5558", ""),
    }
    assert set(wanted_sources(fleet.pools)) == {"http://a:8000", "http://b:8000"}


SGLANG = {URL: "sglang"}


@pytest.mark.parametrize("bare", [False, True], ids=["sglang-0.5.23", "earlier-sglang"])
async def test_an_sglang_endpoint_is_read_in_sglangs_format(
        context: zmq.asyncio.Context, bare: bool) -> None:
    """SGLang 0.5.23 replays as vLLM does; earlier SGLang without the topic frame."""
    engine, sink = Engine(context, codec=SglangCodec(), bare=bare), Sink()
    engine.publish(0, live=False)  # only the replay has it
    async with running(sink, context) as manager:
        await manager.sync({URL: engine.source()}, SGLANG)
        await engine.subscribed()
        await until(lambda: sink.batches(URL) == [0], "the initial replay")
        engine.publish(1)
        engine.publish(2, live=False)  # lost on the way: replayed
        engine.publish(3)
        await until(lambda: len(sink.batches(URL)) >= 4, "live batches and the gap")
        assert sink.batches(URL) == [0, 1, 2, 3]
        counters = manager.counters()[URL]
        assert counters.decode_errors == 0 and counters.resets == 0
    await engine.close()


async def test_an_endpoint_whose_engine_changed_starts_over(
        context: zmq.asyncio.Context) -> None:
    engine, sink = Engine(context, replay=False), Sink()
    async with running(sink, context) as manager:
        await manager.sync({URL: engine.source()})
        await engine.subscribed()
        await manager.sync({URL: engine.source()}, {URL: "vllm"})  # the same: nothing restarts
        assert sink.resets(URL) == 0
        await manager.sync({URL: engine.source()}, SGLANG)
        assert sink.resets(URL) == 1 and manager.sources() == {URL: engine.source()}
    await engine.close()
