"""A planner killed outright leaves no replay running: its local worker processes end with it
(gateway.plan.executors.die_with_parent). A real process tree: a child Python starts the
planner's executor, reports its worker's pid and is killed with SIGKILL (no cleanup of its
own); the worker must be gone within a generous bound."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux")

PLANNER = """
import os, sys, time
from gateway.plan.executors import local_executor
pool = local_executor(1)
print(pool.submit(os.getpid).result(), flush=True)
time.sleep(600)
"""
GONE_WITHIN_S = 60.0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def test_a_killed_planner_takes_its_workers_with_it() -> None:
    planner = subprocess.Popen([sys.executable, "-c", PLANNER], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)  # its resource tracker
                                                                      # warns of the kill
    worker = None
    try:
        assert planner.stdout is not None
        worker = int(planner.stdout.readline())
        assert worker != planner.pid and _alive(worker)
        os.kill(planner.pid, signal.SIGKILL)
        planner.wait()
        deadline = time.monotonic() + GONE_WITHIN_S
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(worker), "the worker outlived the planner"
    finally:
        planner.kill()
        planner.wait()
        if worker is not None and _alive(worker):  # the test failed: leave nothing behind
            os.kill(worker, signal.SIGKILL)
