"""The simulator's KV event transport against real ZMQ sockets on 127.0.0.1: vLLM's frames and
sequence numbers, replay from a sequence number, binding and shutdown."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import zmq

from backends.kv_events.wire import END_SEQ, seq_bytes, seq_of
from backends.sim.kv_publisher import ZmqPublisher
from tests.fakes.harness import free_ports

PROBE = b"\x00probe"
WAIT_MS = 30_000


def addresses(n: int) -> list[str]:
    return [f"tcp://127.0.0.1:{p}" for p in free_ports(n)]


def subscribe(publisher: ZmqPublisher, address: str) -> zmq.Socket[bytes]:
    """A SUB socket that receives ``publisher``'s batches: probes are published until one
    arrives (a PUB drops what it sends before the subscription reaches it)."""
    sub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
    sub.connect(address)
    sub.subscribe(b"")
    deadline = time.monotonic() + WAIT_MS / 1000
    while time.monotonic() < deadline:
        publisher.publish(PROBE)
        if sub.poll(100):
            return sub
    sub.close(linger=0)
    raise AssertionError(f"no subscription to {address}")


def receive(sub: zmq.Socket[bytes], count: int) -> list[list[bytes]]:
    """The next ``count`` messages that are not probes."""
    out: list[list[bytes]] = []
    while len(out) < count:
        assert sub.poll(WAIT_MS), "a batch did not arrive"
        frames = sub.recv_multipart()
        if frames[2] != PROBE:
            out.append(frames)
    return out


def replay(address: str, start: int, want: int) -> list[list[bytes]]:
    """Ask the replay socket for the batches from ``start`` on, until at least ``want`` come
    back (the publisher's thread may not have sent the last ones yet): the answers, END
    included."""
    deadline = time.monotonic() + WAIT_MS / 1000
    while True:
        dealer: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        dealer.connect(address)
        try:
            dealer.send_multipart((b"", seq_bytes(start)))
            answers = []
            while True:
                assert dealer.poll(WAIT_MS), "the replay socket did not answer"
                answers.append(dealer.recv_multipart())
                if answers[-1][2] == END_SEQ:
                    break
        finally:
            dealer.close(linger=0)
        if len(answers) > want or time.monotonic() > deadline:
            return answers
        time.sleep(0.05)


@pytest.fixture
def closing() -> Iterator[list[ZmqPublisher | zmq.Socket[bytes]]]:
    things: list[ZmqPublisher | zmq.Socket[bytes]] = []
    yield things
    for thing in things:
        if isinstance(thing, ZmqPublisher):
            thing.close()
        else:
            thing.close(linger=0)


def test_each_batch_goes_out_as_topic_seq_payload_numbered_one_by_one(
        closing: list[ZmqPublisher | zmq.Socket[bytes]]) -> None:
    [address] = addresses(1)
    publisher = ZmqPublisher(address, topic="kv")
    closing.append(publisher)
    sub = subscribe(publisher, address)
    closing.append(sub)
    publisher.publish(b"one")
    publisher.publish(b"two")
    first, second = receive(sub, 2)
    assert first[0] == second[0] == b"kv"
    assert (first[2], second[2]) == (b"one", b"two")
    assert len(first[1]) == 8 and seq_of(second[1]) == seq_of(first[1]) + 1


def test_sequence_numbers_start_at_zero_and_replay_answers_from_any_of_them(
        closing: list[ZmqPublisher | zmq.Socket[bytes]]) -> None:
    address, replay_address = addresses(2)
    publisher = ZmqPublisher(address, replay_address, topic="t")
    closing.append(publisher)
    for payload in (b"a", b"b", b"c"):
        publisher.publish(payload)
    answers = replay(replay_address, 0, 3)
    assert answers == [[b"", b"t", seq_bytes(0), b"a"], [b"", b"t", seq_bytes(1), b"b"],
                       [b"", b"t", seq_bytes(2), b"c"], [b"", b"", END_SEQ, b""]]
    assert replay(replay_address, 2, 1) == [[b"", b"t", seq_bytes(2), b"c"],
                                            [b"", b"", END_SEQ, b""]]


def test_replay_keeps_only_the_last_buffer_steps_batches(
        closing: list[ZmqPublisher | zmq.Socket[bytes]]) -> None:
    address, replay_address = addresses(2)
    publisher = ZmqPublisher(address, replay_address, buffer_steps=3)
    closing.append(publisher)
    for i in range(5):
        publisher.publish(b"p%d" % i)
    answers = replay(replay_address, 0, 3)
    assert [seq_of(a[2]) for a in answers] == [2, 3, 4, -1]
    assert [a[3] for a in answers[:-1]] == [b"p2", b"p3", b"p4"]


def test_a_malformed_replay_request_gets_no_answer_and_harms_nothing(
        closing: list[ZmqPublisher | zmq.Socket[bytes]]) -> None:
    address, replay_address = addresses(2)
    publisher = ZmqPublisher(address, replay_address)
    closing.append(publisher)
    publisher.publish(b"x")
    dealer: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    closing.append(dealer)
    dealer.connect(replay_address)
    dealer.send_multipart((b"", b"", seq_bytes(0)))  # one frame too many
    answers = replay(replay_address, 0, 1)
    assert [seq_of(a[2]) for a in answers] == [0, -1]
    assert not dealer.poll(0)


def test_a_taken_address_is_an_os_error_naming_it(
        closing: list[ZmqPublisher | zmq.Socket[bytes]]) -> None:
    address, replay_address = addresses(2)
    closing.append(ZmqPublisher(address))
    with pytest.raises(OSError, match=address.replace(".", r"\.")):
        ZmqPublisher(address)
    with pytest.raises(OSError, match=address.replace(".", r"\.")):
        ZmqPublisher(replay_address, address)  # the replay address is taken
    closing.append(_bind_again(replay_address))  # the failed one released what it bound


def test_close_sends_what_is_queued_then_frees_the_address(
        closing: list[ZmqPublisher | zmq.Socket[bytes]]) -> None:
    [address] = addresses(1)
    publisher = ZmqPublisher(address)
    sub = subscribe(publisher, address)
    closing.append(sub)
    for i in range(100):
        publisher.publish(b"%d" % i)
    publisher.close()
    publisher.close()  # idempotent
    assert [m[2] for m in receive(sub, 100)] == [b"%d" % i for i in range(100)]
    with pytest.raises(RuntimeError):
        publisher.publish(b"late")
    closing.append(_bind_again(address))


def _bind_again(address: str) -> ZmqPublisher:
    """A publisher on ``address`` once the closed one's socket let go of it."""
    deadline = time.monotonic() + WAIT_MS / 1000
    while True:
        try:
            return ZmqPublisher(address)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
