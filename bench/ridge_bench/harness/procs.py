"""The benchmarks' child processes: the engine stand-in, gateways, each in its own process.

:func:`spawn` starts a command with its output in a log file in ``workdir``, optionally pinned
to CPU cores with ``taskset -c`` (the pid is the command's own: taskset execs it).
:func:`start_upstream` runs the engine stand-in (:mod:`ridge_bench.harness.upstream`) and reads its
``READY <port> ...`` line; :func:`start_ridge` runs ``ridge serve`` (the installed command)
on a free port and waits until ``GET /ready`` answers 200. Both are bounded by
``start_timeout_s``. :meth:`Child.cpu_seconds` reads the user + system CPU seconds of the
process and all its descendants from ``/proc`` (Linux; None elsewhere), and
:func:`machine_busy_seconds` the whole machine's, so other load on it shows.
:meth:`Child.stop` sends SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S`` seconds, to that
child's pid only.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[3]
"""The repository root (children run there: fleet files are named relative to it)."""
BENCH_SRC = Path(__file__).resolve().parents[2]
"""Where :mod:`ridge_bench` lives, so children find it without an install."""
STOP_TIMEOUT_S = 15.0


@dataclass
class Child:
    """One running child process and its log file."""

    name: str
    proc: asyncio.subprocess.Process
    log_path: Path
    url: str = ""

    def cpu_seconds(self) -> float | None:
        """User + system CPU seconds the process and its descendants used so far (from /proc;
        None if unavailable)."""
        return tree_cpu_seconds(self.proc.pid)

    def has_loaded(self, fragment: str) -> bool | None:
        """Whether a file whose path contains ``fragment`` is mapped into the process (an
        imported extension module shows here); None if /proc is unavailable."""
        try:
            return fragment in Path(f"/proc/{self.proc.pid}/maps").read_text()
        except OSError:
            return None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    async def stop(self) -> None:
        if self.proc.returncode is not None:
            return
        self.proc.terminate()
        try:
            await asyncio.wait_for(self.proc.wait(), STOP_TIMEOUT_S)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


def _stat_fields(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3 onwards)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def tree_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` and every live descendant, plus the children it
    has already reaped (cutime + cstime); None if ``pid`` has no /proc entry."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    ticks = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    for child in _descendants(pid):
        child_fields = _stat_fields(child)
        if child_fields is not None:
            ticks += int(child_fields[11]) + int(child_fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def _descendants(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(entry.name)) is not None:
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def machine_busy_seconds() -> float | None:
    """CPU seconds every process of the machine used so far, all cores added (/proc/stat:
    everything but idle and iowait; None if unavailable)."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    ticks = [int(x) for x in first[1:9]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def child_env(extra: Mapping[str, str] | None = None, drop_prefix: str = "") -> dict[str, str]:
    """This process's environment with the product and :mod:`ridge_bench` importable (the
    repository root and the bench folder first on ``PYTHONPATH``), without the variables
    whose names start with ``drop_prefix`` (if given), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not (drop_prefix and k.startswith(drop_prefix))}
    paths = (str(ROOT), str(BENCH_SRC), env.get("PYTHONPATH"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.update(extra or {})
    return env


def pinned(argv: Sequence[str], cpus: Sequence[int] | None) -> list[str]:
    """``argv`` under ``taskset -c CPUS`` (None: unpinned)."""
    if not cpus:
        return list(argv)
    return ["taskset", "-c", ",".join(str(c) for c in cpus), *argv]


async def spawn(name: str, argv: Sequence[str], workdir: Path, env: Mapping[str, str],
                stdout_pipe: bool = False, cwd: Path = ROOT,
                cpus: Sequence[int] | None = None, drop_prefix: str = "") -> Child:
    """``argv`` as a child process (stdin closed, output to ``workdir/NAME.log``; stdout to a
    pipe instead if ``stdout_pipe``) with :func:`child_env` (``env``, ``drop_prefix``),
    pinned to ``cpus``."""
    log_path = workdir / f"{name}.log"
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            *pinned(argv, cpus), cwd=cwd, env=child_env(env, drop_prefix),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE if stdout_pipe else log, stderr=log,
        )
    return Child(name, proc, log_path)


async def start_upstream(workdir: Path, ports: int, chunks: int, start_timeout_s: float,
                         cpus: Sequence[int] | None = None) -> tuple[Child, list[str]]:
    """The engine stand-in on ``ports`` free ports: the child and its base URLs."""
    argv = [sys.executable, "-m", "ridge_bench.harness.upstream", "--chunks", str(chunks),
            "--ports", *(["0"] * ports)]
    child = await spawn("upstream", argv, workdir, {}, stdout_pipe=True, cpus=cpus)
    assert child.proc.stdout is not None
    try:
        line = await asyncio.wait_for(child.proc.stdout.readline(), start_timeout_s)
    except TimeoutError:
        line = b""
    if not line.startswith(b"READY "):
        await child.stop()
        raise RuntimeError(f"engine stand-in did not start:\n{child.log_tail()}")
    urls = [f"http://127.0.0.1:{int(p)}" for p in line.split()[1:]]
    child.url = urls[0]
    return child, urls


def ridge_command(config: Path, port: int) -> list[str]:
    """``ridge serve`` (the installed command next to this interpreter, else the module)."""
    ridge = Path(sys.executable).parent / "ridge"
    head = [str(ridge)] if ridge.exists() else [sys.executable, "-m", "gateway.cli.main"]
    return [*head, "serve", "--config", str(config), "--port", str(port)]


async def start_ridge(name: str, workdir: Path, config: Path, env: Mapping[str, str],
                      start_timeout_s: float) -> Child:
    """ridge on a free port, ready (``GET /ready`` is 200) or RuntimeError with its log."""
    port = free_port()
    child = await spawn(name, ridge_command(config, port), workdir, env)
    child.url = f"http://127.0.0.1:{port}"
    if not await _wait_ready(child, start_timeout_s):
        await child.stop()
        raise RuntimeError(f"ridge ({name}) did not become ready:\n{child.log_tail()}")
    return child


async def _wait_ready(child: Child, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    timeout = aiohttp.ClientTimeout(total=1.0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while time.monotonic() < deadline and child.proc.returncode is None:
            try:
                async with session.get(child.url + "/ready") as resp:
                    if resp.status == 200:
                        return True
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.1)
    return False
