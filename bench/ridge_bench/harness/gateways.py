"""The gateways the overhead benchmark puts in front of the engine stand-in, and how each is
started (one process each, pinned to the gateway core by the caller).

- ``ridge``: ``ridge serve --config FLEET --port P`` with every default setting (no ``RIDGE_*``
  variable reaches it) and a fleet of one vLLM pool over the stand-in's endpoints
  (:func:`fleet`). ``ridge_src`` runs another source tree instead (``python -m gateway.cli
  serve`` there, with it first on the import path), e.g. an older commit in a git worktree.
  ``ridge-aiohttp`` (not run by default): the same with the aiohttp upstream transport.
- ``fastapi``, ``aiohttp``: the bare pass-throughs of :mod:`ridge_bench.overhead.passthrough`;
  ``asgi-uvicorn``, ``asgi-granian`` (not run by default): its bare ASGI app on two servers.
- ``sglang-rr``, ``sglang-ca``: the SGLang router (``sglang-router`` from PyPI, pinned to
  :data:`SGLANG_ROUTER`), round robin and cache_aware, from its own virtual environment
  (:func:`sglang_python`; never a dependency of ridge or of its tests). Its Prometheus
  listener goes to a free port; everything else is its default.

:func:`ready` waits until the gateway answers a real non-streamed completion with 200.
:func:`start` is shared with the router comparison (:mod:`ridge_bench.compare.benchmark`), which
puts the
SGLang router in front of the simulated fleet the same way.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from ridge_bench.harness.procs import ROOT, Child, free_port, ridge_command, spawn
from ridge_bench.harness.upstream import MODEL, PACED_MODEL

SGLANG_ROUTER = "sglang-router==0.3.2"
BENCH_VENV = ROOT / ".bench-venv"
INSTALL_TIMEOUT_S = 900.0
_CHECK = ("import importlib.metadata as m, sglang_router.launch_router; "
          f"raise SystemExit(m.version('sglang-router') != '{SGLANG_ROUTER.split('==')[1]}')")


@dataclass(frozen=True)
class Gateway:
    """One gateway under test: its key, its label in the tables, and how it starts."""

    key: str
    label: str
    kind: str  # "ridge" | "passthrough" | "sglang"
    arg: str = ""  # the pass-through's server, the SGLang router's policy, ridge's transport
    workers: int = 1  # ridge: ``--workers``


GATEWAYS: tuple[Gateway, ...] = (
    Gateway("ridge", "ridge, default settings", "ridge"),
    Gateway("fastapi", "FastAPI + aiohttp client, no routing", "passthrough", "fastapi"),
    Gateway("aiohttp", "aiohttp.web + aiohttp client, no routing", "passthrough", "aiohttp"),
    Gateway("sglang-rr", "SGLang router 0.3.2, round robin", "sglang", "round_robin"),
    Gateway("sglang-ca", "SGLang router 0.3.2, cache_aware", "sglang", "cache_aware"),
)
SERVER_COMPARISON: tuple[Gateway, ...] = (
    Gateway("asgi-uvicorn", "bare ASGI app on uvicorn + httptools, no routing", "passthrough",
            "asgi-uvicorn"),
    Gateway("asgi-granian", "bare ASGI app on granian, no routing", "passthrough",
            "asgi-granian"),
)
"""Not run by default (``--gateways asgi-uvicorn,asgi-granian``): the HTTP servers compared."""
TRANSPORT_COMPARISON: tuple[Gateway, ...] = (
    Gateway("ridge-aiohttp", "ridge, aiohttp upstream transport", "ridge", "aiohttp"),
)
"""Not run by default (``--gateways ridge,ridge-aiohttp``): ridge's other upstream transport."""
BY_KEY: Mapping[str, Gateway] = {
    g.key: g for g in (*GATEWAYS, *SERVER_COMPARISON, *TRANSPORT_COMPARISON)}


@dataclass(frozen=True)
class Launch:
    """Where the gateways come from: ridge's source tree (None: the installed ``ridge``) and
    the SGLang router's interpreter (None: not available)."""

    ridge_src: Path | None = None
    sglang_python: Path | None = None


def fleet(urls: Sequence[str]) -> dict[str, Any]:
    """ridge's fleet file: one vLLM pool (prefix caching on, as vLLM's default) over ``urls``
    serving the stand-in's models; no routing section, so every routing setting is default.
    The facts are Llama-3-8B on an L4; they only scale ridge's estimates."""
    return {"pools": [{
        "name": "bench", "engine": "vllm", "models": [MODEL, PACED_MODEL],
        "endpoints": list(urls), "levers": {"prefix_caching": True},
        "model": {"params": 8.03e9, "layers": 32, "hidden_size": 4096, "kv_heads": 8,
                  "head_dim": 128, "dtype_bytes": 2, "max_context": 8192},
        "hardware": {"name": "l4", "peak_flops": 121.0e12, "mem_bandwidth": 300.0e9},
    }]}


def command(gateway: Gateway, launch: Launch, port: int, urls: Sequence[str],
            workdir: Path) -> tuple[list[str], dict[str, str], Path]:
    """argv, extra environment and working directory of ``gateway`` on ``port``."""
    if gateway.kind == "ridge":
        config = workdir / "fleet.yaml"
        config.write_text(yaml.safe_dump(fleet(urls), sort_keys=False))
        extra = ["--workers", str(gateway.workers)] if gateway.workers != 1 else []
        env = {"RIDGE_UPSTREAM__TRANSPORT": gateway.arg} if gateway.arg else {}
        if launch.ridge_src is None:
            return [*ridge_command(config, port), *extra], env, ROOT
        argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config),
                "--port", str(port), *extra]
        return argv, {**env, "PYTHONPATH": str(launch.ridge_src)}, launch.ridge_src
    if gateway.kind == "passthrough":
        argv = [sys.executable, "-m", "ridge_bench.overhead.passthrough", "--server", gateway.arg,
                "--port", str(port), "--upstream", *urls]
        return argv, {}, ROOT
    if launch.sglang_python is None:
        raise RuntimeError("the SGLang router is not installed")
    argv = [str(launch.sglang_python), "-m", "sglang_router.launch_router",
            "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls,
            "--policy", gateway.arg, "--prometheus-port", str(free_port())]
    return argv, {"PYTHONPATH": ""}, workdir


async def start(gateway: Gateway, launch: Launch, urls: Sequence[str], workdir: Path,
                cpus: Sequence[int] | None, timeout_s: float, model: str = MODEL) -> Child:
    """``gateway`` on a free port, answering a completion for ``model`` (:func:`ready`), or
    RuntimeError with its log; the process is stopped if waiting fails in any way."""
    port = free_port()
    argv, env, cwd = command(gateway, launch, port, urls, workdir)
    child = await spawn(gateway.key, argv, workdir, env, cwd=cwd, cpus=cpus, drop_prefix="RIDGE_")
    child.url = f"http://127.0.0.1:{port}"
    try:
        answered = await ready(child, timeout_s, model)
    except BaseException:
        await child.stop()
        raise
    if not answered:
        await child.stop()
        raise RuntimeError(f"{gateway.key} did not answer within {timeout_s:.0f} s:\n"
                           f"{child.log_tail()}")
    return child


async def ready(child: Child, timeout_s: float, model: str = MODEL) -> bool:
    """Whether ``child`` answers a non-streamed chat completion for ``model`` with 200 within
    ``timeout_s``. One output token: a simulated engine without a limit decodes to the end of
    the context, far past the per-try timeout."""
    body = {"model": model, "messages": [{"role": "user", "content": "ready?"}],
            "max_tokens": 1}
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
        while time.monotonic() < deadline and child.proc.returncode is None:
            try:
                async with session.post(child.url + "/v1/chat/completions", json=body) as resp:
                    await resp.read()
                    if resp.status == 200:
                        return True
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.25)
    return False


def sglang_python(install: bool, log: Path) -> tuple[Path | None, str]:
    """The interpreter of :data:`BENCH_VENV` with the SGLang router importable, creating the
    environment and installing it there when ``install`` (bounded by
    :data:`INSTALL_TIMEOUT_S`); else None and why."""
    python = BENCH_VENV / "bin" / "python"
    if _imports_router(python):
        return python, ""
    if not install:
        return None, f"not installed in {BENCH_VENV.name}/ (and --no-install)"
    steps = ([sys.executable, "-m", "venv", str(BENCH_VENV)],
             [str(python), "-m", "pip", "install", "-q", SGLANG_ROUTER])
    with log.open("ab") as out:
        for argv in steps:
            try:
                done = subprocess.run(argv, stdout=out, stderr=out, timeout=INSTALL_TIMEOUT_S,
                                      check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                return None, f"cannot install {SGLANG_ROUTER}: {exc}"
            if done.returncode != 0:
                return None, f"cannot install {SGLANG_ROUTER} (see {log.name})"
    if _imports_router(python):
        return python, ""
    return None, f"{SGLANG_ROUTER} installed but does not import (see {log.name})"


def _imports_router(python: Path) -> bool:
    if not python.exists():
        return False
    try:
        done = subprocess.run([str(python), "-c", _CHECK], capture_output=True, timeout=120,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0
