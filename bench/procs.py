"""The benchmark's child processes: the fake upstream and ridge, each in its own process.

:func:`start_upstream` runs :mod:`bench.upstream` and reads its ``READY <port>`` line;
:func:`start_ridge` runs ``ridge serve`` (the installed command) or :mod:`bench.ridge_variant`
on a free port and waits until ``GET /ready`` answers 200. Both are bounded by
``start_timeout_s``; both log to a file in ``workdir``. :meth:`Child.cpu_seconds` reads the
process's user + system CPU time from ``/proc`` (Linux; None elsewhere), and
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

ROOT = Path(__file__).resolve().parent.parent
STOP_TIMEOUT_S = 15.0


@dataclass
class Child:
    """One running child process and its log file."""

    name: str
    proc: asyncio.subprocess.Process
    log_path: Path
    url: str = ""

    def cpu_seconds(self) -> float | None:
        """User + system CPU seconds used so far (from /proc; None if unavailable)."""
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        except OSError:
            return None
        fields = stat.rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

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


def _env(extra: Mapping[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


async def _spawn(name: str, argv: Sequence[str], workdir: Path, env: Mapping[str, str],
                 stdout_pipe: bool = False) -> Child:
    log_path = workdir / f"{name}.log"
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=ROOT, env=_env(env), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE if stdout_pipe else log, stderr=log,
        )
    return Child(name, proc, log_path)


async def start_upstream(workdir: Path, chunks: int, interval_ms: float,
                         start_timeout_s: float) -> Child:
    """The fake engine; ``child.url`` is its base URL."""
    argv = [sys.executable, "-m", "bench.upstream", "--port", "0", "--chunks", str(chunks),
            "--interval-ms", str(interval_ms)]
    child = await _spawn("upstream", argv, workdir, {}, stdout_pipe=True)
    assert child.proc.stdout is not None
    try:
        line = await asyncio.wait_for(child.proc.stdout.readline(), start_timeout_s)
    except TimeoutError:
        line = b""
    if not line.startswith(b"READY "):
        await child.stop()
        raise RuntimeError(f"fake upstream did not start:\n{child.log_tail()}")
    child.url = f"http://127.0.0.1:{int(line.split()[1])}"
    return child


def ridge_command(variant_args: Sequence[str] | None, config: Path, port: int) -> list[str]:
    """``ridge serve`` when ``variant_args`` is None, else :mod:`bench.ridge_variant`."""
    common = ["--config", str(config), "--port", str(port)]
    if variant_args is None:
        ridge = Path(sys.executable).parent / "ridge"
        head = [str(ridge)] if ridge.exists() else [sys.executable, "-m", "gateway.cli"]
        return [*head, "serve", *common]
    return [sys.executable, "-m", "bench.ridge_variant", *common, *variant_args]


async def start_ridge(name: str, workdir: Path, config: Path, env: Mapping[str, str],
                      variant_args: Sequence[str] | None, start_timeout_s: float) -> Child:
    """ridge on a free port, ready (``GET /ready`` is 200) or RuntimeError with its log."""
    port = free_port()
    child = await _spawn(name, ridge_command(variant_args, config, port), workdir, env)
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
