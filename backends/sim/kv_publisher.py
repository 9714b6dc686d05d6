"""The simulator's KV-cache event transport: vLLM's ZMQ publisher, socket for socket.

:class:`ZmqPublisher` puts vLLM's ``ZmqEventPublisher`` transport on the wire, described in
:mod:`backends.kv_events.wire` (SGLang's is the same, frame for frame): a PUB socket sends
``(topic, seq, payload)`` per batch, an optional ROUTER socket replays the last
``buffer_steps`` batches. The payloads are the engine's
(:class:`backends.sim.kv_events.SimKvEvents`).

Threading, as vLLM's: the engine loop never waits on a subscriber. :meth:`ZmqPublisher.publish`
hands the payload to a background thread that alone owns the sockets and the replay buffer; an
empty frame (:data:`STOP`) ends it. Binding: exactly the addresses given; a taken port raises
``OSError``. Memory: at most ``buffer_steps`` batches kept and ``hwm`` queued
(:data:`BUFFER_STEPS`, :data:`HWM`: vLLM's defaults). See docs/simulator.md#the-event-publisher.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from itertools import count

import zmq

from backends.kv_events.wire import END_SEQ, seq_bytes, seq_of

log = logging.getLogger(__name__)

BUFFER_STEPS = 10_000
"""vLLM's (and SGLang's) ``KVEventsConfig.buffer_steps`` default [batches]."""
HWM = 100_000
"""vLLM's (and SGLang's) ``KVEventsConfig.hwm`` default [batches]."""
STOP = b""
"""The end-of-stream frame handed to the thread (a payload is never empty)."""
JOIN_TIMEOUT_S = 10.0
"""[s] How long :meth:`ZmqPublisher.close` waits for the thread to send what is queued."""
LINGER_MS = 1000
"""[ms] How long ZMQ keeps trying to deliver a closed PUB socket's last batches."""


class ZmqPublisher:
    """One engine's KV-cache event stream (module docstring)."""

    def __init__(self, address: str, replay_address: str | None = None, topic: str = "",
                 buffer_steps: int = BUFFER_STEPS, hwm: int = HWM) -> None:
        if buffer_steps < 1 or hwm < 1:
            raise ValueError("buffer_steps and hwm must be positive")
        self._topic = topic.encode("utf-8")
        self._context = zmq.Context()  # its own: the in-process hand-off needs one context
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._owned: list[tuple[zmq.Socket[bytes], int]] = []  # the thread's, with their linger
        self._closed = False
        inbox = f"inproc://ridge-sim-kv-events-{id(self):x}"
        try:
            self._pub = self._bound(zmq.PUB, address, hwm, LINGER_MS)
            self._replay = (self._bound(zmq.ROUTER, replay_address, hwm, 0)
                            if replay_address is not None else None)
            self._pull = self._bound(zmq.PULL, inbox, hwm, 0)
        except BaseException:
            self._close_owned()
            self._context.term()
            raise
        self._push: zmq.Socket[bytes] = self._context.socket(zmq.PUSH)
        self._push.set_hwm(hwm)
        self._push.connect(inbox)
        self._thread = threading.Thread(target=self._run, name=f"kv-events {address}",
                                        daemon=True)
        self._thread.start()

    def _bound(self, kind: int, address: str, hwm: int, linger_ms: int) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] = self._context.socket(kind)
        self._owned.append((sock, linger_ms))
        sock.set_hwm(hwm)
        try:
            sock.bind(address)
        except zmq.ZMQError as exc:
            raise OSError(exc.errno, f"cannot bind {address}: {exc.strerror}") from exc
        return sock

    def publish(self, payload: bytes) -> None:
        """Send one batch's payload (an :class:`backends.kv_events.wire.EventCodec`'s)."""
        if self._closed:
            raise RuntimeError("the KV event publisher is closed")
        if payload:
            self._push.send(payload, copy=False)

    def close(self) -> None:
        """Send what is queued, stop the thread and close the sockets (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._push.send(STOP)
        self._thread.join(JOIN_TIMEOUT_S)
        self._push.close(linger=0)
        if not self._thread.is_alive():  # its sockets are closed: the context ends at once
            self._context.term()

    # -- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._pull, zmq.POLLIN)
        if self._replay is not None:
            poller.register(self._replay, zmq.POLLIN)
        seqs = count()
        try:
            while True:
                ready = dict(poller.poll())
                if self._replay is not None and self._replay in ready:
                    self._serve_replay(self._replay)
                if self._pull in ready and not self._send(seqs):
                    return
        finally:
            self._close_owned()

    def _send(self, seqs: count[int]) -> bool:
        """Publish every queued batch; False once the end-of-stream frame came."""
        while True:
            try:
                payload = self._pull.recv(zmq.NOBLOCK)
            except zmq.Again:
                return True
            if payload == STOP:
                return False
            seq = next(seqs)
            self._pub.send_multipart((self._topic, seq_bytes(seq), payload))
            self._buffer.append((seq, payload))

    def _serve_replay(self, replay: zmq.Socket[bytes]) -> None:
        """Answer one replay request (malformed ones are ignored, as vLLM does; a failed
        answer is logged and the stream goes on)."""
        frames = replay.recv_multipart()
        if len(frames) != 3:
            return
        client, _, start = frames
        first = seq_of(start)
        try:
            for seq, payload in self._buffer:
                if seq >= first:
                    replay.send_multipart((client, b"", self._topic, seq_bytes(seq), payload))
            replay.send_multipart((client, b"", b"", END_SEQ, b""))
        except zmq.ZMQError:
            log.exception("KV event replay to a subscriber failed")

    def _close_owned(self) -> None:
        for sock, linger_ms in self._owned:
            sock.close(linger=linger_ms)
        self._owned.clear()
