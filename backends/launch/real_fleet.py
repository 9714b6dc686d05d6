"""Run a fleet file's vLLM pools as real engines on this machine (``ridge demo --real``).

Each endpoint of each pool becomes one ``python -m vllm.entrypoints.openai.api_server``
process from the environment ``deploy/vllm-cpu/setup.sh`` builds (``.engines/vllm-venv``,
model ``.engines/smollm2-135m``), launched with the flags its pool's levers render
(:mod:`backends.launch.vllm`) on the endpoint URL's port, its compute threads bound to one
core (engines round-robin over the cores). Start-up waits for every ``/health`` within
``startup_timeout_s`` seconds; stopping sends SIGTERM to each engine's process group, then
SIGKILL after ``grace_s`` seconds; an engine also gets SIGTERM when the gateway process dies
(Linux parent-death signal). Engine output goes to ``<log_dir>/<pool>-<port>.log``.

Only vLLM runs here: SGLang needs CUDA (or an AMX CPU), so a pool of another engine is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from backends.launch.vllm import vllm_command, vllm_env
from config.engines import Engine
from config.fleet import Fleet

ENGINES_DIR_VARIABLE = "RIDGE_ENGINES_DIR"  # as deploy/vllm-cpu/setup.sh names it


def engines_dir() -> Path:
    """Where ``deploy/vllm-cpu/setup.sh`` built the engines: ``$RIDGE_ENGINES_DIR``, else
    ``.engines`` in the working directory (the repository root, where ``make engines`` puts
    it)."""
    return Path(os.environ.get(ENGINES_DIR_VARIABLE) or ".engines")


class RealFleetError(RuntimeError):
    """The real engines cannot be started (missing set-up, unsupported engine, start-up failed)."""


@dataclass
class RealFleet:
    """Engine processes of one fleet; ``stop`` ends them all."""

    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    grace_s: float = 10.0

    async def stop(self) -> None:
        for proc in self.processes:
            _signal(proc, signal.SIGTERM)
        await asyncio.gather(*(self._reap(p) for p in self.processes))

    async def _reap(self, proc: subprocess.Popen[bytes]) -> None:
        try:
            await asyncio.wait_for(asyncio.to_thread(proc.wait), self.grace_s)
        except TimeoutError:
            _signal(proc, signal.SIGKILL)
            await asyncio.to_thread(proc.wait)


def engine_paths(root: Path) -> tuple[str, str]:
    """(vLLM's python, the model folder), or RealFleetError naming the set-up script."""
    python, model = root / "vllm-venv" / "bin" / "python", root / "smollm2-135m"
    if not python.exists() or not (model / "config.json").exists():
        raise RealFleetError(f"no real engine set-up in {root.resolve()}: run "
                             "deploy/vllm-cpu/setup.sh (make engines) in a checkout first, "
                             f"and run from its root or set {ENGINES_DIR_VARIABLE}")
    return str(python), str(model)


async def start_real_fleet(fleet: Fleet, log_dir: Path, startup_timeout_s: float = 300.0,
                           root: Path | None = None) -> RealFleet:
    """Launch every endpoint of ``fleet`` as a real vLLM and wait until all are healthy
    (``root``: the engines' directory, default :func:`engines_dir`)."""
    python, model = engine_paths(root or engines_dir())
    refused = [p.name for p in fleet.pools if p.engine is not Engine.VLLM]
    if refused:
        raise RealFleetError(f"only vLLM runs on this machine; pools {refused} are not vLLM")
    log_dir.mkdir(parents=True, exist_ok=True)
    running = RealFleet()
    cores = os.cpu_count() or 1
    urls = [(pool, url) for pool in fleet.pools for url in pool.endpoint_urls()]
    for i, (pool, url) in enumerate(urls):
        port = urlsplit(url).port or 80
        log = open(log_dir / f"{pool.name}-{port}.log", "wb")  # noqa: SIM115 - owned by the child
        running.processes.append(subprocess.Popen(
            vllm_command(python, pool, port, model), stdout=log, stderr=subprocess.STDOUT,
            env=vllm_env(os.environ, cpu_bind=str(i % cores)), start_new_session=True,
            preexec_fn=_die_with_parent,
        ))
    try:
        await _wait_healthy([u for _, u in urls], running, startup_timeout_s, log_dir)
    except BaseException:
        await running.stop()
        raise
    return running


async def _wait_healthy(urls: list[str], running: RealFleet, timeout_s: float,
                        log_dir: Path) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        pending = set(urls)
        while pending:
            dead = [p for p in running.processes if p.poll() is not None]
            if dead:
                raise RealFleetError(f"an engine exited during start-up; see logs in {log_dir}")
            if loop.time() > deadline:
                raise RealFleetError(f"engines not healthy after {timeout_s:.0f} s: "
                                     f"{sorted(pending)}; see logs in {log_dir}")
            pending = {u for u in pending if not await _healthy(session, u)}
            await asyncio.sleep(1.0)


async def _healthy(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(url + "/health") as resp:
            return resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the gateway dies, even by SIGKILL (Linux prctl
    PR_SET_PDEATHSIG = 1), so no engine outlives it."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def _signal(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
