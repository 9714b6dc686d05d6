"""Which conversation fills each arrival: the run-time half of a workload.

A conversation's next turn can only be sent once its previous reply has arrived (the reply is
part of the next prompt). So arrivals (open-loop, fixed in advance) are filled at run time:

1. an arrival of kind K takes the conversation of kind K that has waited longest with a turn
   ready (first in, first out), so users take turns;
2. if none is ready, it starts the next unstarted conversation of kind K (index order);
3. a reply ends the turn: the conversation becomes ready again if it has turns left; a failed
   turn ends the conversation (its user gives up).

Conversation contents are fixed by the seed (:mod:`ridge_bench.harness.workloads`); only their
interleaving
depends on timing. Sources are endless, so rule 2 always finds a conversation.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from ridge_bench.harness.prefix import Message
from ridge_bench.harness.workloads import Conversation, Source, full_messages


@dataclass
class Session:
    """A conversation in progress: the replies so far and the turn to send next."""

    conversation: Conversation
    replies: list[str] = field(default_factory=list)

    @property
    def turn(self) -> int:
        return len(self.replies)

    @property
    def finished(self) -> bool:
        return self.turn >= len(self.conversation.turns)


@dataclass(frozen=True)
class Pending:
    """One turn on its way: the session, the turn's index, its messages and reply length."""

    session: Session
    turn: int
    messages: list[Message]
    max_tokens: int

    @property
    def kind(self) -> str:
        return self.session.conversation.kind


class Dispatcher:
    """Fills arrivals with conversations' turns (module doc)."""

    def __init__(self, sources: Mapping[str, Source]) -> None:
        self._sources = sources
        self._started: dict[str, int] = dict.fromkeys(sources, 0)
        self._ready: dict[str, deque[Session]] = {k: deque() for k in sources}

    def take(self, kind: str) -> Pending:
        """The next turn for an arrival of ``kind``."""
        ready = self._ready[kind]
        session = ready.popleft() if ready else self._start(kind)
        conv = session.conversation
        turn = session.turn
        return Pending(session, turn, full_messages(conv, turn, session.replies),
                       conv.turns[turn].max_tokens)

    def _start(self, kind: str) -> Session:
        index = self._started[kind]
        self._started[kind] = index + 1
        return Session(self._sources[kind].conversation(index))

    def done(self, pending: Pending, reply: str | None) -> None:
        """Record the turn's reply (None: the turn failed, the conversation ends)."""
        session = pending.session
        if reply is None:
            return
        session.replies.append(reply)
        if not session.finished:
            self._ready[pending.kind].append(session)

    def started(self, kind: str) -> int:
        """Conversations of ``kind`` started so far."""
        return self._started[kind]
