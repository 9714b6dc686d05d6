"""Child processes: pinning, environment, and CPU time of a whole process tree."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from ridge_bench.harness.procs import BENCH_SRC, ROOT, child_env, pinned, spawn, tree_cpu_seconds


def test_pinned() -> None:
    assert pinned(["x", "-y"], None) == ["x", "-y"]
    assert pinned(["x"], [0, 1]) == ["taskset", "-c", "0,1", "x"]


def test_child_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIDGE_PORT", "1")
    env = child_env({"A": "b"}, drop_prefix="RIDGE_")
    assert "RIDGE_PORT" not in env and env["A"] == "b"
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [str(ROOT), str(BENCH_SRC)]
    assert child_env()["RIDGE_PORT"] == "1"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
async def test_cpu_of_a_child_counts_its_live_grandchild(tmp_path: Path) -> None:
    grandchild = ("import time\nt = time.process_time()\n"
                  "while time.process_time() - t < 0.3: pass\n"
                  "print('burnt', flush=True)\ntime.sleep(1)\n")
    code = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {grandchild!r}])"
    child = await spawn("burn", [sys.executable, "-c", code], tmp_path, {}, stdout_pipe=True)
    assert child.proc.stdout is not None
    assert await asyncio.wait_for(child.proc.stdout.readline(), 30) == b"burnt\n"
    used = tree_cpu_seconds(child.proc.pid)
    assert used is not None and used >= 0.25  # the grandchild, still alive, is counted
    await asyncio.wait_for(child.proc.wait(), 30)
    assert tree_cpu_seconds(child.proc.pid) is None  # reaped
