"""``ridge serve --workers N``: N gateway processes on one listening port, routing as one.

The supervisor (this process) opens the listening socket, maps the workers' shared region
(:class:`gateway.state.shared_memory.SharedRegion`: in-flight counts, the event log) and a lock
file in
a private run directory, then forks N workers. Each worker serves the same app on the inherited
socket (the kernel hands each new connection to one of them) with a
:class:`~gateway.state.shared_memory.WorkerState`, and answers the other workers' ``/metrics``
requests on its own Unix socket so any of them can answer a scrape for all
(:mod:`gateway.workers.merged_metrics`).

Lifecycle: SIGTERM or SIGINT to the supervisor is passed to every worker (each stops
gracefully) and the supervisor returns when all are gone; SIGHUP is passed on too (each worker
reloads the fleet file, :mod:`gateway.fleet.reload`). A worker that dies otherwise is
replaced, its in-flight counts taken off the shared totals first; one that dies within
:data:`FAST_FAIL_S` of its start :data:`FAST_FAILS` times in a row stops the gateway (exit 1):
a worker that cannot start would only be restarted forever.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from config.fleet import Fleet
from gateway.state.shared_memory import SharedRegion, WorkerContext

log = logging.getLogger("ridge.workers")

FAST_FAIL_S = 5.0  # [s] a worker that dies this soon after its start failed to start
FAST_FAILS = 3  # such failures in a row that stop the gateway

WorkerMain = Callable[[WorkerContext, socket.socket], int]
"""What a forked worker runs: serve on the socket; its exit status."""


@dataclass
class _Workers:
    """The supervisor's book: worker pid → (index, start time), and the failures in a row."""

    children: dict[int, tuple[int, float]] = field(default_factory=dict)
    fast_fails: int = 0
    stopping: bool = False
    status: int = 0


def serve_workers(fleet: Fleet, workers: int, sock: socket.socket,
                  worker_main: WorkerMain) -> int:
    """Run ``workers`` worker processes until told to stop; the exit status."""
    run_dir = Path(tempfile.mkdtemp(prefix="ridge-workers-"))
    urls = [url for pool in fleet.pools for url in pool.endpoint_urls()]
    region = SharedRegion(urls, workers, str(run_dir / "state.lock"))
    pages = tuple(str(run_dir / f"metrics-{i}.sock") for i in range(workers))
    book = _Workers()
    previous = _install_signals(book)
    try:
        for i in range(workers):
            _start(book, WorkerContext(i, region, pages), sock, worker_main)
        _supervise(book, region, pages, sock, worker_main)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(run_dir, ignore_errors=True)
    return book.status


def _install_signals(book: _Workers) -> dict[int, Any]:
    """SIGTERM and SIGINT stop every worker, SIGHUP reloads every worker's fleet file; the
    handlers they replace."""
    def stop(signum: int, frame: FrameType | None) -> None:
        book.stopping = True
        for pid in book.children:
            _kill(pid, signal.SIGTERM)

    def reload(signum: int, frame: FrameType | None) -> None:
        for pid in book.children:
            _kill(pid, signal.SIGHUP)

    handlers: dict[int, Any] = {sig: signal.signal(sig, stop)
                                for sig in (signal.SIGTERM, signal.SIGINT)}
    handlers[signal.SIGHUP] = signal.signal(signal.SIGHUP, reload)
    return handlers


def _start(book: _Workers, context: WorkerContext, sock: socket.socket,
           worker_main: WorkerMain) -> None:
    pid = os.fork()
    if pid == 0:  # the worker
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until the worker's reload handler
        code = 1
        try:
            code = worker_main(context, sock)
        finally:
            os._exit(code)
    book.children[pid] = (context.index, time.monotonic())
    log.info("worker %d started (pid %d)", context.index, pid)


def _supervise(book: _Workers, region: SharedRegion, pages: tuple[str, ...],
               sock: socket.socket, worker_main: WorkerMain) -> None:
    while book.children:
        pid, wait_status = os.wait()
        index, started = book.children.pop(pid, (-1, 0.0))
        if index < 0 or book.stopping:
            continue
        log.warning("worker %d (pid %d) ended unexpectedly (status %d); starting another",
                    index, pid, os.waitstatus_to_exitcode(wait_status))
        book.fast_fails = book.fast_fails + 1 if time.monotonic() - started < FAST_FAIL_S else 0
        if book.fast_fails >= FAST_FAILS:
            log.error("workers keep failing at start-up; stopping")
            book.stopping, book.status = True, 1
            for other in book.children:
                _kill(other, signal.SIGTERM)
            continue
        _clear(region, index, pages[index])
        _start(book, WorkerContext(index, region, pages), sock, worker_main)


def _clear(region: SharedRegion, index: int, page: str) -> None:
    """A dead worker's reservations leave the shared loads; its metrics socket goes."""
    region.clear_worker(index)
    Path(page).unlink(missing_ok=True)


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
