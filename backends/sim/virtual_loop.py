"""An asyncio event loop on virtual time: asyncio programs run with no sleeping at all.

:class:`VirtualTimeLoop` is a selector event loop whose :meth:`~VirtualTimeLoop.time` is a
virtual clock [s], starting at 0. Whenever the loop has nothing ready to run, it jumps its
clock to the next scheduled timer instead of blocking, so ``asyncio.sleep``, ``wait_for``,
``call_later`` and every timeout take no wall time, in the order and at the times they would
have had. Callbacks that are ready run first, as on any loop, and the loop still polls its
file descriptors (without waiting), so ``call_soon_threadsafe`` and executors work; work handed
to a thread takes no virtual time.

Invariant: virtual time moves only while nothing is ready, and never backwards; a timer never
runs before its time (:meth:`VirtualTimeLoop.call_at`). A loop with
nothing ready and no timer waits for a thread or a file descriptor at most
``deadlock_after_s`` wall seconds, then raises :class:`VirtualDeadlock` rather than hang. The
simulator's engines run on it through :class:`backends.sim.clock.LoopClock`. See
docs/simulator.md#virtual-time-for-asyncio-programs.
"""

from __future__ import annotations

import asyncio
import contextvars
import selectors
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar, TypeVarTuple

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class VirtualDeadlock(RuntimeError):
    """The loop would wait forever: nothing ready, no timer, nothing to poll."""


class _VirtualSelector(selectors.BaseSelector):
    """A selector that polls its file descriptors without waiting and, where the loop would
    have waited ``timeout`` seconds for them, advances the loop's virtual clock instead."""

    def __init__(self, deadlock_after_s: float) -> None:
        self._inner = selectors.DefaultSelector()
        self._deadlock_after_s = deadlock_after_s
        self.now = 0.0

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._inner.get_map()

    def close(self) -> None:
        self._inner.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._inner.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer: only a thread or a file descriptor can wake the loop
            ready = self._inner.select(self._deadlock_after_s)
            if not ready:
                raise VirtualDeadlock(
                    f"virtual-time loop: nothing ready, no timer scheduled, and nothing arrived "
                    f"within {self._deadlock_after_s:g} s: the program waits forever")
            return ready
        self.now += timeout
        return []


RESOLUTION = time.get_clock_info("monotonic").resolution
"""[s] The resolution asyncio takes its clock to have: a timer due within it of now is run
(asyncio's ``_run_once``)."""
DEADLOCK_AFTER_S = 10.0
"""[s] How long a loop with no timer waits, on the wall clock, for a thread or a file
descriptor before it raises :class:`VirtualDeadlock`."""


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose clock is virtual (module docstring)."""

    def __init__(self, deadlock_after_s: float = DEADLOCK_AFTER_S) -> None:
        self._virtual = _VirtualSelector(deadlock_after_s)
        super().__init__(self._virtual)

    def time(self) -> float:
        return self._virtual.now

    def call_at(self, when: float, callback: Callable[[*Ts], object], *args: *Ts,
                context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        """As asyncio's, but a timer due within :data:`RESOLUTION` of now is moved to now +
        :data:`RESOLUTION`: asyncio runs such a timer at once, counting it due, so on virtual
        time, where nothing else moves the clock, a wait for a moment a hair ahead (a float's
        rounding) would end at once, again and again, with the clock standing still."""
        now = self._virtual.now
        if now < when < now + RESOLUTION:
            when = now + RESOLUTION
        return super().call_at(when, callback, *args, context=context)


def run(main: Coroutine[Any, Any, T], deadlock_after_s: float = DEADLOCK_AFTER_S) -> T:
    """Run ``main`` to completion on a fresh :class:`VirtualTimeLoop`, as ``asyncio.run`` does
    on a real one (pending tasks are cancelled and the loop closed afterwards)."""
    with asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(deadlock_after_s)) as runner:
        return runner.run(main)
