"""The engine loop in real (or virtual) time: steps an :class:`EngineCore` and hands tokens out.

:class:`EngineRunner` steps the core at the clock's ``now``; after a working step it sleeps
until the step's end (``duration / speed`` wall seconds) and delivers its tokens, and when idle
it waits for a request, a KV transfer or the next known event. Invariant: a step that follows
a working step begins where that one ended on the simulated timeline, so the simulator's own
computing and late wake-ups fall inside the steps' durations instead of adding to them.

Requests enter through :meth:`EngineRunner.submit` (a :class:`RequestHandle` the HTTP layer
reads tokens from) and leave by :meth:`EngineRunner.abort`; ``after_step`` runs once each step
is over (the step's KV-cache events go out then). See docs/simulator.md#the-real-time-runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from backends.sim.clock import Clock
from backends.sim.engine import EngineCore, StepOutcome
from backends.sim.request import Phase, SimRequest

log = logging.getLogger(__name__)


class RequestHandle:
    """One request's output as it is produced: token batches, then a finish reason."""

    def __init__(self, request: SimRequest) -> None:
        self.request = request
        self.finish: str | None = None
        self._buffer: list[str] = []
        self._event = asyncio.Event()
        self._finished = asyncio.Event()

    def push(self, tokens: list[str], finish: str | None) -> None:
        self._buffer.extend(tokens)
        if finish is not None:
            self.finish = finish
            self._finished.set()
        self._event.set()

    async def next_batch(self) -> tuple[list[str], str | None]:
        """Tokens produced since the last call (waits for at least one step) and the finish
        reason once the request is done."""
        while not self._buffer and self.finish is None:
            await self._event.wait()
            self._event.clear()
        out, self._buffer = self._buffer, []
        return out, self.finish

    async def rest(self) -> tuple[list[str], str]:
        """Every token not yet taken, once the request is done (its reader wakes once, at the
        end, however many steps that takes), and the finish reason."""
        await self._finished.wait()
        out, self._buffer = self._buffer, []
        assert self.finish is not None
        return out, self.finish

    async def collect(self) -> tuple[list[str], str]:
        """Every token until the request finishes, and its finish reason."""
        tokens: list[str] = []
        while True:
            batch, finish = await self.next_batch()
            tokens.extend(batch)
            if finish is not None:
                return tokens, finish


class EngineRunner:
    """Drives one engine core on ``clock``."""

    def __init__(self, core: EngineCore, clock: Clock) -> None:
        self.core = core
        self.clock = clock
        self._handles: dict[str, RequestHandle] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.after_step: Callable[[], None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def submit(self, request: SimRequest) -> RequestHandle:
        """Queue ``request`` as arriving now."""
        request.arrival = self.clock.now()
        handle = RequestHandle(request)
        self._handles[request.rid] = handle
        self.core.add(request)
        self.wake()
        return handle

    def abort(self, handle: RequestHandle) -> None:
        """Drop the request (no-op once it finished)."""
        self._handles.pop(handle.request.rid, None)
        if handle.request.phase is not Phase.FINISHED:
            self.core.abort(handle.request, self.clock.now())
            self.wake()

    def fail(self, handle: RequestHandle) -> None:
        """Abort the request and tell its reader (finish reason ``abort``)."""
        self.abort(handle)
        handle.push([], "abort")

    def release_held(self, rid: str) -> None:
        """Free a prefill engine's held KV (its decode engine has it now)."""
        self.core.release_held(rid)
        self.wake()

    def wake(self) -> None:
        self._wake.set()

    async def _loop(self) -> None:
        due: float | None = None  # the last working step's end, on the simulated timeline
        while True:
            now = self.clock.now()
            try:
                outcome = self.core.step(now)
            except Exception:  # a bug in the core must not kill the server silently
                log.exception("simulated engine step failed")
                raise
            if outcome.idle:
                due = None
                self._step_over()
                nxt = self.core.next_event_time(now)
                await self.clock.wait(self._wake, None if nxt is None else nxt - now)
                self._wake.clear()
                continue
            began = now if due is None else max(due, now - outcome.seconds)
            due = began + outcome.seconds
            await self.clock.sleep(due - self.clock.now())
            self._deliver(outcome)
            self._step_over()

    def _step_over(self) -> None:
        hook = self.after_step
        if hook is None:
            return
        try:
            hook()
        except Exception:  # as a failed step: loud, not silent
            log.exception("simulated engine's after-step hook failed")
            raise

    def _deliver(self, outcome: StepOutcome) -> None:
        for e in outcome.emissions:
            handle = self._handles.get(e.request.rid)
            if handle is None:
                continue
            handle.push(e.tokens, e.finish)
            if e.finish is not None:
                del self._handles[e.request.rid]
