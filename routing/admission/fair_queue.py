"""A queue fair across keys: round-robin over per-key FIFO queues.

Algorithm: each key (an API key's name, a client's ``user``, or None for every anonymous
request together) has its own first-in-first-out queue; the keys take turns in the order they
first had something queued. The head is the first item of the key whose turn it is. When the
head is *served*, its key's turn ends: the key goes to the back of the rotation (and leaves it
when its queue is empty). An item that leaves without being served (its wait ran out, its client
went away) is taken out of its key's queue without moving the key. So a key that queues 100
requests and a key that queues 1 alternate: the second waits for at most one of the first's,
not for all 100. Deficit round-robin with equal quanta of one request.

Parameters: none. Every operation is O(1) but :meth:`FairQueue.remove` (O(own key's queue)) and
:meth:`FairQueue.served_before` (O(keys)).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


def served_before(own: int, others: Iterable[int]) -> int:
    """How many queued requests a new request of one key is served after: its key's ``own``
    queued ones, and from every other key's queue (its length in ``others``) up to own + 1
    (each other key gets a turn per turn of its key, and may have the turn first). Own 2,
    others 5 and 1 → 2 + 3 + 1 = 6; a new key (own 0) → one of each other key."""
    return own + sum(min(n, own + 1) for n in others)


class FairQueue(Generic[T]):
    """Items queued by key, served round-robin across keys (module docstring)."""

    __slots__ = ("_keys", "_size")

    def __init__(self) -> None:
        self._keys: OrderedDict[Hashable, deque[T]] = OrderedDict()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def join(self, key: Hashable, item: T) -> None:
        """Queue ``item`` at the back of ``key``'s queue (a new key: last in the rotation)."""
        queue = self._keys.get(key)
        if queue is None:
            queue = self._keys[key] = deque()
        queue.append(item)
        self._size += 1

    def head(self) -> T | None:
        """The item served next (None when empty)."""
        for queue in self._keys.values():
            return queue[0]
        return None

    def served(self, key: Hashable, item: T) -> None:
        """``item``, the head, was served: it leaves, and its key's turn ends."""
        queue = self._keys[key]
        if not queue or queue[0] != item or next(iter(self._keys)) != key:
            raise ValueError("only the head can be served")
        queue.popleft()
        self._size -= 1
        if queue:
            self._keys.move_to_end(key)
        else:
            del self._keys[key]

    def remove(self, key: Hashable, item: T) -> bool:
        """``item`` leaves unserved (no turn is used); False when it is not queued."""
        queue = self._keys.get(key)
        if queue is None:
            return False
        for i, queued in enumerate(queue):
            if queued == item:
                del queue[i]
                self._size -= 1
                if not queue:
                    del self._keys[key]
                return True
        return False

    def queued(self, key: Hashable) -> int:
        """Items queued under ``key``."""
        queue = self._keys.get(key)
        return len(queue) if queue is not None else 0

    def served_before(self, key: Hashable) -> int:
        """How many queued items a new item of ``key`` would be served after
        (:func:`served_before`)."""
        return served_before(self.queued(key),
                             (len(q) for k, q in self._keys.items() if k != key))
