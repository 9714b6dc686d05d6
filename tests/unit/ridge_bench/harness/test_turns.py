"""Filling arrivals with conversation turns."""

from __future__ import annotations

from dataclasses import dataclass

from ridge_bench.harness.turns import Dispatcher
from ridge_bench.harness.workloads import Conversation, Turn


@dataclass(frozen=True)
class FakeSource:
    turns: int
    kind: str = "agent"

    def conversation(self, index: int) -> Conversation:
        return Conversation(f"c{index}", self.kind, ({"role": "system", "content": "S"},),
                            tuple(Turn(f"c{index} turn {k}", 10 + k) for k in range(self.turns)))


def test_new_conversations_start_while_none_is_ready() -> None:
    d = Dispatcher({"agent": FakeSource(3)})
    a, b = d.take("agent"), d.take("agent")
    assert (a.session.conversation.key, b.session.conversation.key) == ("c0", "c1")
    assert d.started("agent") == 2
    assert a.max_tokens == 10 and a.messages[-1]["content"] == "c0 turn 0"


def test_a_ready_conversation_goes_first_in_first_out_with_its_history() -> None:
    d = Dispatcher({"agent": FakeSource(3)})
    a, b = d.take("agent"), d.take("agent")
    d.done(b, "reply b0")
    d.done(a, "reply a0")
    nxt = d.take("agent")
    assert nxt.session.conversation.key == "c1" and nxt.turn == 1
    assert [m["content"] for m in nxt.messages] == ["S", "c1 turn 0", "reply b0", "c1 turn 1"]
    assert d.take("agent").session.conversation.key == "c0"
    assert d.started("agent") == 2


def test_finished_and_failed_conversations_are_not_taken_again() -> None:
    d = Dispatcher({"agent": FakeSource(1)})
    a = d.take("agent")
    d.done(a, "the only reply")  # one turn: finished
    b = d.take("agent")
    d.done(b, None)  # failed: its user gives up
    assert d.take("agent").session.conversation.key == "c2"
