"""The fair queue: round-robin over per-key FIFO queues."""

from __future__ import annotations

import pytest

from routing.admission.fair_queue import FairQueue, served_before


def drain(queue: FairQueue[str], keys: dict[str, str | None]) -> list[str]:
    order = []
    while (head := queue.head()) is not None:
        queue.served(keys[head], head)
        order.append(head)
    return order


def test_keys_take_turns_whatever_one_of_them_queued() -> None:
    queue: FairQueue[str] = FairQueue()
    keys: dict[str, str | None] = {}
    for item in ("a1", "a2", "a3", "a4"):
        queue.join("A", item)
        keys[item] = "A"
    for item in ("b1", "b2"):
        queue.join("B", item)
        keys[item] = "B"
    queue.join(None, "n1")
    keys["n1"] = None  # anonymous requests share one key
    assert len(queue) == 7
    assert drain(queue, keys) == ["a1", "b1", "n1", "a2", "b2", "a3", "a4"]
    assert len(queue) == 0 and queue.head() is None


def test_a_key_arriving_later_gets_its_turn_after_one_of_each() -> None:
    queue: FairQueue[str] = FairQueue()
    for i in range(5):
        queue.join("heavy", f"h{i}")
    queue.served("heavy", "h0")  # heavy's turn ends: it goes to the back
    queue.join("light", "l0")
    assert queue.head() == "h1"
    queue.served("heavy", "h1")
    assert queue.head() == "l0"


def test_leaving_unserved_uses_no_turn() -> None:
    queue: FairQueue[str] = FairQueue()
    queue.join("A", "a1")
    queue.join("A", "a2")
    queue.join("B", "b1")
    assert queue.remove("A", "a1") and not queue.remove("A", "a1")
    assert queue.head() == "a2"  # A keeps its turn
    assert queue.remove("A", "a2") and queue.queued("A") == 0
    assert queue.head() == "b1" and not queue.remove("C", "x")


def test_only_the_head_can_be_served() -> None:
    queue: FairQueue[str] = FairQueue()
    queue.join("A", "a1")
    queue.join("B", "b1")
    with pytest.raises(ValueError):
        queue.served("B", "b1")


def test_served_before_counts_round_robin_turns() -> None:
    assert served_before(2, [5, 1]) == 6  # own 2, then up to 3 of the 5, and the 1
    assert served_before(0, [5, 1]) == 2  # a new key: one of each other key
    assert served_before(0, []) == 0
    queue: FairQueue[str] = FairQueue()
    for i in range(5):
        queue.join("A", f"a{i}")
    queue.join("B", "b0")
    queue.join("B", "b1")
    assert queue.served_before("C") == 2
    assert queue.served_before("B") == 2 + 3
    assert queue.served_before("A") == 5 + 2
