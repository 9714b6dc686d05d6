"""KV-cache events from the engines: one ZMQ subscriber per endpoint, feeding a sink.

An engine launched with ``--kv-events-config`` publishes every block its prefix cache stores or
evicts (:meth:`config.pools.Pool.kv_event_sources`); this module hands the decoded events
(:mod:`routing.kv_events.events`) to a :class:`KvEventSink`, endpoint by endpoint, in order,
each batch once. The transport and the payloads are each engine's
:data:`backends.kv_events.wire.WIRE_FORMATS` entry: ``(topic, seq, payload)`` on a PUB socket,
and an optional ROUTER socket that replays buffered batches.

:class:`KvEventSubscriber` (one task per endpoint) replays from 0 at start, skips batches
already applied, fills a gap by replay (else resets the endpoint in the sink), treats a ``seq``
that goes back as an engine restart, counts and skips malformed messages, and starts over after
``retry_s`` on a socket error. No queue of its own: at most ``rcvhwm`` batches wait in ZMQ.
:class:`KvEventSubscribers` keeps one per wanted endpoint (:func:`wanted_sources`) and counts
per endpoint (:class:`KvEventCounters`). See docs/backends.md#subscribers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

import msgspec
import zmq
import zmq.asyncio

from backends.kv_events.wire import END_SEQ, WIRE_FORMATS, seq_bytes, seq_of
from config.kv_events import KvEventSource
from config.pools import Pool
from routing.kv_events.events import KvEvent

log = logging.getLogger("ridge.kv_events")

T = TypeVar("T")
SEQ_BYTES = 8  # the seq frame: 8 bytes, big-endian


class KvEventSink(Protocol):
    """Where decoded events go: ``apply`` one batch of an endpoint's events, in order;
    ``reset`` forget everything known of an endpoint (its engine restarted, or events were
    lost)."""

    def apply(self, endpoint: str, events: Sequence[KvEvent]) -> None: ...

    def reset(self, endpoint: str) -> None: ...


@dataclass(frozen=True, slots=True)
class SubscriberSettings:
    """``rcvhwm``: batches ZMQ holds per endpoint while the subscriber is busy [batches];
    ``replay_timeout_s``: the longest wait for each replay message [s]; ``retry_s``: the wait
    before reconnecting after a failure [s]; ``log_interval_s``: at most one warning of a kind
    per endpoint this often [s]; ``reconnect_max_s``: ZMQ's reconnection back-off cap [s]."""

    rcvhwm: int = 10_000
    replay_timeout_s: float = 5.0
    retry_s: float = 2.0
    log_interval_s: float = 60.0
    reconnect_max_s: float = 5.0


@dataclass(slots=True)
class KvEventCounters:
    """One endpoint's counts since its subscriber started, each monotonic: batches and events
    handed to the sink, resets, malformed messages, replay requests (the one at start
    included), sink failures; and ``last_seq`` / ``last_ts``, the last batch applied and its
    engine time [s since the epoch]."""

    batches_applied: int = 0
    events_applied: int = 0
    resets: int = 0
    decode_errors: int = 0
    replays: int = 0
    sink_errors: int = 0
    last_seq: int | None = None
    last_ts: float | None = None


class _Throttle:
    """Warnings at most once per ``interval_s`` and kind; the ones held back are counted."""

    def __init__(self, interval_s: float) -> None:
        self._interval_s = interval_s
        self._next: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def warn(self, kind: str, message: str, *args: object) -> None:
        now = time.monotonic()
        if now < self._next.get(kind, 0.0):
            self._held[kind] = self._held.get(kind, 0) + 1
            return
        self._next[kind] = now + self._interval_s
        held = self._held.pop(kind, 0)
        log.warning(message + ("" if not held else f" ({held} more since the last such line)"),
                    *args)


class KvEventSubscriber:
    """The event stream of one endpoint (module docstring), whose engine is ``engine`` (a key
    of :data:`backends.kv_events.wire.WIRE_FORMATS`); :meth:`run` until cancelled."""

    def __init__(self, endpoint: str, source: KvEventSource, sink: KvEventSink,
                 context: zmq.asyncio.Context,
                 settings: SubscriberSettings = SubscriberSettings(),
                 engine: str = "vllm") -> None:
        self.endpoint, self.source, self.engine = endpoint, source, engine
        self.counters = KvEventCounters()
        self._sink, self._context, self._settings = sink, context, settings
        self._topic = source.topic.encode()
        wire = WIRE_FORMATS[engine]
        self._codec = wire.codec()
        self._bare_replay = wire.bare_replay
        self._throttle = _Throttle(settings.log_interval_s)
        self._last: int | None = None
        self._live_last: int | None = None
        self._dirty = False

    async def run(self) -> None:
        """Read the stream until cancelled, starting over after any failure."""
        while True:
            try:
                await self._stream()
            except Exception as exc:  # noqa: BLE001 - the subscriber outlives any one failure
                self._throttle.warn("failure", "KV events of %s: %s: %s; again in %.0f s",
                                    self.endpoint, type(exc).__name__, exc,
                                    self._settings.retry_s)
            self._restart()
            await asyncio.sleep(self._settings.retry_s)

    async def _stream(self) -> None:
        sub = self._socket(zmq.SUB)
        try:
            sub.setsockopt(zmq.RCVHWM, self._settings.rcvhwm)
            sub.setsockopt(zmq.SUBSCRIBE, self._topic)
            sub.connect(self.source.publish)
            if self.source.replay is not None:
                await self._replay(0)
            while True:
                await self._on_live(await sub.recv_multipart())
        finally:
            sub.close(linger=0)

    def _socket(self, kind: int) -> zmq.asyncio.Socket:
        sock = self._context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IPV6, 1)  # a bracketed IPv6 host; IPv4 still works
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, int(self._settings.reconnect_max_s * 1000))
        return sock

    async def _on_live(self, frames: list[bytes]) -> None:
        batch = self._live_batch(frames)
        if batch is None:
            return
        seq, payload = batch
        if self._live_last is not None and seq <= self._live_last:
            log.info("KV events of %s went back from batch %d to %d: the engine restarted",
                     self.endpoint, self._live_last, seq)
            self._restart()
        self._live_last = seq
        if self._last is not None and seq <= self._last:
            return  # applied already, from a replay
        if seq > self._next() and self.source.replay is not None:
            await self._replay(self._next())
            if self._last is not None and seq <= self._last:
                return
        self._take(seq, payload)

    def _next(self) -> int:
        return 0 if self._last is None else self._last + 1

    def _live_batch(self, frames: list[bytes]) -> tuple[int, bytes] | None:
        """(seq, payload) of a live ``(topic, seq, payload)`` message; None to skip it."""
        if len(frames) != 3 or len(frames[1]) != SEQ_BYTES or seq_of(frames[1]) < 0:
            self._malformed(f"a message of {len(frames)} frames, not (topic, seq, payload)")
            return None
        if frames[0] != self._topic:
            return None  # another topic sharing this one's prefix
        return seq_of(frames[1]), frames[2]

    async def _replay(self, start: int) -> None:
        """Ask the replay socket for every batch from ``start`` on and take each new one."""
        assert self.source.replay is not None
        self.counters.replays += 1
        dealer = self._socket(zmq.DEALER)
        try:
            dealer.connect(self.source.replay)
            await self._within(dealer.send_multipart([b"", seq_bytes(start)]))
            while not self._is_end(frames := await self._within(dealer.recv_multipart())):
                batch = self._replayed(frames)
                if batch is not None and (self._last is None or batch[0] > self._last):
                    self._take(*batch)
        except (TimeoutError, zmq.ZMQError) as exc:
            reason = "no answer" if isinstance(exc, TimeoutError) else str(exc)
            self._throttle.warn("replay", "KV event replay from %s for %s failed: %s",
                                self.source.replay, self.endpoint, reason)
        finally:
            dealer.close(linger=0)

    async def _within(self, step: Awaitable[T]) -> T:
        return await asyncio.wait_for(step, self._settings.replay_timeout_s)

    def _replayed(self, frames: list[bytes]) -> tuple[int, bytes] | None:
        """(seq, payload) of a replayed ``(b"", topic, seq, payload)`` (or ``(b"", seq,
        payload)`` from an engine whose replay may leave the topic out); None to skip a
        malformed one."""
        bare = self._bare_replay and len(frames) == 3
        if (len(frames) != 4 and not bare) or frames[0] != b"" or len(frames[-2]) != SEQ_BYTES:
            self._malformed(f"a replayed message of {len(frames)} frames")
            return None
        return seq_of(frames[-2]), frames[-1]

    def _is_end(self, frames: list[bytes]) -> bool:
        """The replay's end marker ``(b"", b"", END_SEQ, b"")`` (or ``(b"", END_SEQ, b"")``
        from an engine whose replay may leave the topic out)."""
        if self._bare_replay and len(frames) == 3:
            return frames[0] == b"" and frames[1] == END_SEQ
        return len(frames) == 4 and frames[0] == b"" and frames[2] == END_SEQ

    def _take(self, seq: int, payload: bytes) -> None:
        """Apply batch ``seq``, the next one or, past a gap nothing fills, after a reset."""
        if seq > self._next() and self._dirty:
            log.info("KV events of %s lost batches %d to %d: resetting", self.endpoint,
                     self._next(), seq - 1)
            self._reset()
        self._last = seq
        try:
            ts, events = self._codec.decode(payload)
        except msgspec.DecodeError as exc:
            self._malformed(f"batch {seq} is not a KV event batch: {exc}")
            return
        self._apply(seq, ts, events)

    def _apply(self, seq: int, ts: float, events: list[KvEvent]) -> None:
        self._dirty = True
        try:
            self._sink.apply(self.endpoint, events)
        except Exception as exc:  # noqa: BLE001 - a sink's failure is the sink's
            self.counters.sink_errors += 1
            self._throttle.warn("sink", "KV events of %s: the sink failed on batch %d: %s: %s",
                                self.endpoint, seq, type(exc).__name__, exc)
            return
        counters = self.counters
        counters.batches_applied += 1
        counters.events_applied += len(events)
        counters.last_seq, counters.last_ts = seq, ts

    def _malformed(self, what: str) -> None:
        self.counters.decode_errors += 1
        self._throttle.warn("decode", "KV events of %s: skipped %s", self.endpoint, what)

    def _restart(self) -> None:
        """Forget the stream: the next batch starts a new one; the sink forgets too."""
        if self._dirty:
            self._reset()
        self._last = self._live_last = None

    def _reset(self) -> None:
        self._dirty = False
        self.counters.resets += 1
        try:
            self._sink.reset(self.endpoint)
        except Exception as exc:  # noqa: BLE001 - a sink's failure is the sink's
            self.counters.sink_errors += 1
            self._throttle.warn("sink", "KV events of %s: the sink failed to reset: %s: %s",
                                self.endpoint, type(exc).__name__, exc)


@dataclass(slots=True)
class _Running:
    subscriber: KvEventSubscriber
    task: asyncio.Task[None]


class KvEventSubscribers:
    """One :class:`KvEventSubscriber` per wanted endpoint (module docstring). ``context``: a
    ZMQ asyncio context to use (None = one of its own, ended by :meth:`aclose`)."""

    def __init__(self, sink: KvEventSink, settings: SubscriberSettings = SubscriberSettings(),
                 context: zmq.asyncio.Context | None = None) -> None:
        self._sink, self._settings = sink, settings
        self._own_context = context is None
        self._context = zmq.asyncio.Context() if context is None else context
        self._running: dict[str, _Running] = {}
        self._closed = False

    async def sync(self, wanted: Mapping[str, KvEventSource],
                   engines: Mapping[str, str] | None = None) -> None:
        """Subscribe to exactly ``wanted`` (endpoint URL → its stream): start the new ones,
        stop and reset in the sink those gone or whose stream moved. ``engines``: endpoint
        URL → its engine (a key of :data:`backends.kv_events.wire.WIRE_FORMATS`; vLLM for an
        endpoint not in it); a subscriber whose engine changed starts over too. Call it from
        the event loop the subscribers run on."""
        if self._closed:
            raise RuntimeError("KvEventSubscribers is closed")
        kinds = engines or {}
        gone = [e for e, r in self._running.items()
                if (wanted.get(e), kinds.get(e, "vllm"))
                != (r.subscriber.source, r.subscriber.engine)]
        await self._stop(gone)
        for endpoint in gone:
            self._forget(endpoint)
        for endpoint, source in wanted.items():
            if endpoint not in self._running:
                self._start(endpoint, source, kinds.get(endpoint, "vllm"))

    def _start(self, endpoint: str, source: KvEventSource, engine: str) -> None:
        subscriber = KvEventSubscriber(endpoint, source, self._sink, self._context,
                                       self._settings, engine)
        task = asyncio.get_running_loop().create_task(subscriber.run(),
                                                      name=f"kv-events {endpoint}")
        self._running[endpoint] = _Running(subscriber, task)

    async def _stop(self, endpoints: Sequence[str]) -> None:
        tasks = [self._running.pop(e).task for e in endpoints]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    def _forget(self, endpoint: str) -> None:
        try:
            self._sink.reset(endpoint)
        except Exception:  # noqa: BLE001 - a sink's failure is the sink's
            log.exception("KV events: the sink failed to reset %s", endpoint)

    def sources(self) -> dict[str, KvEventSource]:
        """Endpoint URL → the stream subscribed to."""
        return {e: r.subscriber.source for e, r in self._running.items()}

    def counters(self) -> dict[str, KvEventCounters]:
        """Endpoint URL → a copy of its counts now."""
        return {e: replace(r.subscriber.counters) for e, r in self._running.items()}

    async def aclose(self) -> None:
        """Stop every subscriber and close every socket (and the context, if it is ours);
        the sink keeps what it learned."""
        if self._closed:
            return
        self._closed = True
        await self._stop(list(self._running))
        if self._own_context:
            self._context.destroy(linger=0)


def wanted_sources(pools: Iterable[Pool],
                   resolved: Mapping[str, Sequence[str]] | None = None) -> dict[str, KvEventSource]:
    """Endpoint URL → its KV event stream, for every pool of ``pools`` with ``kv_events``:
    what :meth:`KvEventSubscribers.sync` takes. ``resolved``: pool name → its endpoint URLs
    now, for the ``resolve: dns`` pools (:meth:`backends.registry.resolver.DnsResolver.resolve`'s
    answer); a pool not in it has its URLs as written."""
    found = resolved or {}
    return {url: source for pool in pools
            for url, source in pool.kv_event_sources(found.get(pool.name)).items()}
