"""The router state of ``ridge serve --workers N``: worker processes that route as one gateway.

Each worker keeps a full :class:`routing.state.memory.MemoryState` replica and shares, through
memory mapped before the fork (:class:`SharedRegion`), one row (its in-flight requests and
tokens per endpoint; the load read is the sum of the rows) and one log (a ring of what it
learned, applied by every other worker before it decides) per worker. A row and a log have
one writer each and need no lock.

:meth:`WorkerState.place` chooses without a lock on a fresh view and reserves under one
``flock`` for all workers, on condition no other worker took a chosen endpoint since
(:func:`routing.load.taken_since`; the :data:`ATTEMPTS`-th choice unconditionally). A worker
more than a ring of ``log_bytes`` behind skips to the present (:attr:`WorkerState.skipped`);
a dead worker's row is zeroed by the supervisor (:meth:`SharedRegion.clear_worker`).
See docs/gateway.md#the-workers-shared-state.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import time
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from routing.load import NO_LOAD, InFlight, LoadCounts, taken_since
from routing.state.memory import Clock, MemoryState, StateLimits
from routing.state.protocol import Ask, C, Outcome, Placed, Reservation, StateView
from routing.window import WorkloadMeasures

_HEAD = struct.Struct("<IBBH")  # payload length [bytes], kind, worker, endpoint index
_FINISH = struct.Struct("<iIIiBBH")  # recorded_from, prompt, matched, output, ok, session, model
_PAD, _PLACE, _FINISHED = 0, 1, 2
_NONE = -1
ATTEMPTS = 6  # choices per request; the last one is reserved unconditionally


class SharedRegion:
    """Per worker, a row of in-flight counts and a log, in anonymous shared memory (create it
    before the workers fork), and the lock file they share. ``endpoints``: every endpoint URL
    of the fleet, in a fixed order (their index is what rows and records use)."""

    def __init__(self, endpoints: Sequence[str], workers: int, lock_path: str,
                 log_bytes: int = 16 * 2**20) -> None:
        self.endpoints = tuple(endpoints)
        self.index = {url: i for i, url in enumerate(self.endpoints)}
        self.workers = workers
        self.lock_path = lock_path
        self.width = len(self.endpoints) * 2  # (requests, tokens) per endpoint
        self.log_bytes = max(64, log_bytes // 8 * 8)
        self._logs_at = 8 * workers * (1 + self.width)  # write positions, then rows
        self.memory = mmap.mmap(-1, self._logs_at + workers * self.log_bytes)
        self._words = memoryview(self.memory)[:self._logs_at].cast("q")

    def positions(self) -> memoryview:
        """Each worker's log write position [bytes written since start] (int64 × workers)."""
        return self._words[:self.workers]

    def rows(self) -> memoryview:
        """Worker w's (requests, tokens) of endpoint i at ``w * width + 2 * i`` (int64)."""
        return self._words[self.workers:]

    def log(self, worker: int) -> memoryview:
        at = self._logs_at + worker * self.log_bytes
        return memoryview(self.memory)[at:at + self.log_bytes]

    def clear_worker(self, worker: int) -> None:
        """Zero a dead worker's in-flight counts (its log goes on where it stopped)."""
        rows, at = self.rows(), worker * self.width
        for i in range(at, at + self.width):
            rows[i] = 0


@contextmanager
def locked(fd: int) -> Iterator[None]:
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


class WorkerState:
    """A :class:`routing.state.protocol.RouterState` for one worker of ``ridge serve --workers``."""

    finishes_at_once = True  # finish writes to the shared region, no I/O to await

    def __init__(self, region: SharedRegion, worker: int, limits: StateLimits | None = None,
                 clock: Clock = time.monotonic) -> None:
        self._region, self._worker = region, worker
        self._fd = os.open(region.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        self._rows, self._positions = region.rows(), region.positions()
        self._mine = worker * region.width
        self._log = region.log(worker)
        self._local = MemoryState(limits, clock, on_expired=self._expired)
        self._others = [w for w in range(region.workers) if w != worker]
        self._read = {w: self._positions[w] for w in self._others}  # the present
        self.skipped = 0
        """Records lost by falling more than a log ring behind another worker."""

    @property
    def local(self) -> MemoryState:
        return self._local

    # --- the protocol -------------------------------------------------------------------

    def forget_endpoint(self, url: str) -> None:
        self._local.forget_endpoint(url)

    def learned_output(self, model: str) -> float | None:
        return self._local.learned_output(model)

    async def read(self, ask: Ask) -> StateView:
        self._catch_up()
        return self._view(ask)

    async def place(self, ask: Ask, choose: Callable[[StateView], C | None]) -> Placed[C] | None:
        """The others' records, the view with the summed loads and ``choose``, without the
        lock; under it, the reservation on condition that no other worker took a chosen
        endpoint meanwhile (:func:`routing.load.taken_since`), else choose again on a fresh
        view (the :data:`ATTEMPTS`-th choice is reserved unconditionally); after it, the
        replica's reservation and this worker's record."""
        self._catch_up()
        for attempt in range(ATTEMPTS):
            view = self._view(ask)
            choice = choose(view)
            if choice is None:
                return None
            if self._reserve_rows(ask, view, choice.urls, attempt == ATTEMPTS - 1):
                held = tuple(self._hold(url, ask, view.matched_blocks.get(url, 0))
                             for url in choice.urls)
                return Placed(choice, held, view)
        raise AssertionError("unreachable: the last attempt is forced")

    def _reserve_rows(self, ask: Ask, view: StateView, urls: Sequence[str],
                      force: bool) -> bool:
        """Under the lock: unless ``force``, refuse when another worker took one of ``urls``
        since ``view``; else count the request on them in this worker's row."""
        tokens = max(0, ask.tokens)
        with locked(self._fd):
            if not force:
                seen = {url: view.load_of(url).requests for url in ask.endpoints}
                index = self._region.index
                now = {url: self._load(index[url]).requests for url in seen if url in index}
                if taken_since(seen, now, urls):
                    return False
            for url in urls:
                self._add(url, 1, tokens)
        return True

    async def finish(self, reservation: Reservation, outcome: Outcome) -> None:
        """Release and learn in the replica, then this worker's row and record (no lock)."""
        if self._local.release(reservation):
            self._add(reservation.endpoint, -1, -reservation.tokens)
        self._local.learn(reservation.endpoint, reservation.recorded_from, outcome)
        self._append_finish(reservation, outcome)

    def in_flight(self) -> InFlight:
        """This worker's own reservations."""
        return self._local.in_flight()

    def held_blocks(self) -> Mapping[str, int]:
        """The prompt blocks per endpoint of the replicated prefix index."""
        return self._local.held_blocks()

    def measures(self) -> WorkloadMeasures:
        """The (replicated) workload windows; in-flight: every worker's, summed."""
        local = self._local.measures()
        loads = {url: self._load(i) for i, url in enumerate(self._region.endpoints)}
        return WorkloadMeasures(local.window, local.overall, local.by_model,
                                {url: c for url, c in loads.items() if c.requests > 0})

    async def aclose(self) -> None:
        await self._local.aclose()
        os.close(self._fd)

    # --- in-flight rows -----------------------------------------------------------------

    def _add(self, url: str, requests: int, tokens: int) -> None:
        i = self._region.index.get(url)
        if i is not None:
            at = self._mine + 2 * i
            self._rows[at] += requests
            self._rows[at + 1] += tokens

    def _expired(self, url: str, tokens: int) -> None:
        self._add(url, -1, -tokens)

    def _load(self, i: int) -> LoadCounts:
        rows, width, at = self._rows, self._region.width, 2 * i
        requests = tokens = 0
        for w in range(self._region.workers):
            requests += rows[w * width + at]
            tokens += rows[w * width + at + 1]
        return LoadCounts(requests, tokens) if requests > 0 else NO_LOAD

    def _view(self, ask: Ask) -> StateView:
        mine = self._local.view(ask)  # matches, prefix share, session from the replica
        index, load = self._region.index, {}
        for url in ask.endpoints:
            i = index.get(url)
            if i is not None and (counts := self._load(i)).requests > 0:
                load[url] = counts
        return StateView(mine.matched_blocks, load, mine.prefix_share, mine.session_endpoint,
                         footprint=mine.footprint, recent_requests=mine.recent_requests)

    def _hold(self, url: str, ask: Ask, before: int) -> Reservation:
        """The replica's reservation (the row was counted under the lock) and the record."""
        held = self._local.hold(url, ask.tokens, ask.block_hashes, before=before)
        self._append(_PLACE, url, array("Q", ask.block_hashes).tobytes())
        return held

    # --- the logs -----------------------------------------------------------------------

    def _append_finish(self, reservation: Reservation, outcome: Outcome) -> None:
        session = (outcome.session or "").encode()[:255]
        model = outcome.model.encode()[:65535]
        fixed = _FINISH.pack(
            _NONE if reservation.recorded_from is None else reservation.recorded_from,
            max(0, outcome.prompt_tokens), max(0, outcome.matched_tokens),
            _NONE if outcome.output_tokens is None else outcome.output_tokens,
            1 if outcome.succeeded else 0, len(session), len(model))
        hashes = array("Q", outcome.block_hashes).tobytes()
        self._append(_FINISHED, reservation.endpoint, fixed + session + model + hashes)

    def _append(self, kind: int, url: str, payload: bytes) -> None:
        """Append one record to this worker's log. Records take a multiple of 8 bytes, so the
        space left before the end of the ring always holds a padding record's head; a record
        that does not fit there is preceded by padding to the end. The write position moves
        after the record is written."""
        endpoint = self._region.index.get(url)
        size = _record_size(len(payload))
        ring = self._region.log_bytes
        if endpoint is None or size > ring // 4:
            return  # an unknown endpoint, or a prompt too long to share: local only
        position = self._positions[self._worker]
        at = position % ring
        if at + size > ring:
            _HEAD.pack_into(self._log, at, ring - at - _HEAD.size, _PAD, self._worker, 0)
            position += ring - at
            at = 0
        _HEAD.pack_into(self._log, at, len(payload), kind, self._worker, endpoint)
        self._log[at + _HEAD.size:at + _HEAD.size + len(payload)] = payload
        self._positions[self._worker] = position + size

    def _catch_up(self) -> None:
        """Apply every other worker's records written since this worker last read them."""
        for worker in self._others:
            self._read[worker] = self._read_log(worker, self._read[worker])

    def _read_log(self, worker: int, position: int) -> int:
        """Apply ``worker``'s records from ``position`` on; the position read up to. Runs
        without the lock: each record is copied, then kept only if the writer has not come
        round the ring onto it meanwhile (else the reader skips to the present)."""
        ring, end = self._region.log_bytes, self._positions[worker]
        log = self._region.log(worker)
        while position < end:
            if end - position > ring:
                self.skipped += 1
                return self._positions[worker]
            at = position % ring
            length, kind, _, endpoint = _HEAD.unpack_from(log, at)
            size = _record_size(length)
            payload = bytes(log[at + _HEAD.size:at + _HEAD.size + length]) if kind else b""
            if self._positions[worker] - position > ring - size:
                end = self._positions[worker]  # lapped while copying: skipped above
                continue
            if kind != _PAD and endpoint < len(self._region.endpoints):
                self._apply(kind, self._region.endpoints[endpoint], memoryview(payload))
            position += size
        return position

    def _apply(self, kind: int, url: str, payload: memoryview) -> None:
        if kind == _PLACE:
            self._local.record_blocks(url, _hashes(payload), before=0)
            return
        frm, prompt, matched, output, ok, s_len, m_len = _FINISH.unpack_from(payload)
        at = _FINISH.size
        session = bytes(payload[at:at + s_len]).decode() or None
        model = bytes(payload[at + s_len:at + s_len + m_len]).decode()
        hashes = _hashes(payload[at + s_len + m_len:])
        outcome = Outcome(model, hashes, prompt, matched, None if output == _NONE else output,
                          session, bool(ok))
        self._local.learn(url, None if frm == _NONE else frm, outcome)


def _record_size(payload: int) -> int:
    """Bytes a record with a ``payload``-byte payload takes in the ring (a multiple of 8)."""
    return (_HEAD.size + payload + 7) // 8 * 8


def _hashes(raw: memoryview) -> array[int]:
    hashes = array("Q")
    hashes.frombytes(raw)
    return hashes


@dataclass(frozen=True)
class WorkerContext:
    """This process's place among the workers of ``ridge serve --workers N``: its index, the
    shared region, and every worker's metrics socket (by index)."""

    index: int
    region: SharedRegion
    pages: tuple[str, ...]

    @property
    def own_page(self) -> str:
        return self.pages[self.index]

    @property
    def peers(self) -> tuple[str, ...]:
        return tuple(p for i, p in enumerate(self.pages) if i != self.index)
