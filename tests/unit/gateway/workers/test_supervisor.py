"""The supervisor of ``ridge serve --workers``: workers forked on one socket, a dead worker
replaced, a worker that cannot start stops the gateway."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from gateway.state.shared_memory import WorkerContext
from gateway.workers import supervisor
from tests.fakes.harness import fleet_of

FLEET = fleet_of({"p": ["http://127.0.0.1:1", "http://127.0.0.1:2"]})


def test_workers_run_with_their_index_and_a_failing_start_stops_the_gateway(
    tmp_path: Path,
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()

    def worker_main(context: WorkerContext, sock: socket.socket) -> int:
        (marks / f"{context.index}-{os.getpid()}").touch()
        assert context.region.workers == 2 and len(context.pages) == 2
        assert context.peers == (context.pages[1 - context.index],)
        return 3  # dies at once: every start fails fast

    with socket.socket() as sock:
        started = time.monotonic()
        status = supervisor.serve_workers(FLEET, 2, sock, worker_main)
    assert status == 1 and time.monotonic() - started < 30
    runs = sorted(p.name.split("-")[0] for p in marks.iterdir())
    # both started; replacements until FAST_FAILS failures in a row stopped it
    assert runs.count("0") >= 1 and runs.count("1") >= 1
    assert len(runs) <= 2 + supervisor.FAST_FAILS
