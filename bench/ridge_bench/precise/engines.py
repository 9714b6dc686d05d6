"""The two real vLLM CPU engines every router of the precise-routing run is put in front of.

The pool is the real demo fleet's prefix-caching pool (``gateway/demo/demo-real-fleet.yaml``,
``plain``: its levers, model and hardware facts) with two endpoints on fresh 127.0.0.1 ports,
KV-cache events on (:func:`ridge_bench.harness.fleets.with_kv_events`: a publish and a replay
address per engine), and two engine arguments: ``--num-gpu-blocks-override BLOCKS`` (a KV cache
of BLOCKS × 128 tokens, small enough that the traffic evicts) and ``--enable-scale-out`` (the
``/v1/chat/completions/render`` endpoint vLLM's router tokenizes through, 403 without it).

Each engine runs the command ridge renders for the pool (:func:`backends.launch.vllm.vllm_command`)
with its KV events bound on loopback (:func:`loopback_events`), one core each
(``VLLM_CPU_OMP_THREADS_BIND``), ``VLLM_SERVER_DEV_MODE=1`` for ``POST /reset_prefix_cache``
(:func:`reset_prefix_caches`, between routers), its own process group, output to
``<workdir>/vllm-<port>.log``; :class:`backends.launch.real_fleet.RealFleet` stops them.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import yaml

from backends.launch.real_fleet import RealFleet, engine_paths, engines_dir
from backends.launch.vllm import LaunchSettings, engine_event_ports, vllm_command, vllm_env
from config.pools import Pool
from ridge_bench.harness.fleets import with_kv_events
from ridge_bench.harness.procs import ROOT

DEMO_FLEET = ROOT / "gateway" / "demo" / "demo-real-fleet.yaml"
TEMPLATE_POOL = "plain"
BLOCK_TOKENS = 128  # vLLM's KV block on CPUs
ENGINES = 2
EVENTS_FLAG = "--kv-events-config"
LOOPBACK_BIND = "tcp://[::ffff:127.0.0.1]:"
"""vLLM binds a publish endpoint with ``*`` or ``::`` in it and connects to any other, so
this IPv4-mapped form is how its PUB socket binds 127.0.0.1 only (ZMQ binds it as
``tcp://127.0.0.1:PORT``); the replay socket always binds."""
RESET_TRIES = 10


def demo_pool(path: Path = DEMO_FLEET, name: str = TEMPLATE_POOL) -> dict[str, Any]:
    """The raw pool ``name`` of the fleet file at ``path``."""
    raw = yaml.safe_load(path.read_text())
    return next(p for p in raw["pools"] if p["name"] == name)


def engine_pool(template: Mapping[str, Any], ports: Callable[[], int],
                blocks: int) -> dict[str, Any]:
    """The pool of the run (module doc) from ``template``'s levers and facts, on ``ports``."""
    kept = ("engine", "models", "levers", "model", "hardware")
    pool: dict[str, Any] = {"name": "pair", **{k: copy.deepcopy(template[k]) for k in kept}}
    pool["endpoints"] = [f"http://127.0.0.1:{ports()}" for _ in range(ENGINES)]
    pool = with_kv_events({"pools": [pool]}, ports)["pools"][0]
    pool["engine_args"] = ["--num-gpu-blocks-override", str(blocks), "--enable-scale-out"]
    return pool


def loopback_events(argv: Sequence[str]) -> list[str]:
    """``argv`` with its ``--kv-events-config`` endpoints bound on 127.0.0.1 instead of every
    interface (``tcp://*:P``): the publisher as :data:`LOOPBACK_BIND`, the replay socket as
    ``tcp://127.0.0.1:P``."""
    out = list(argv)
    if EVENTS_FLAG not in out:
        return out
    at = out.index(EVENTS_FLAG) + 1
    config = json.loads(out[at])
    config["endpoint"] = config["endpoint"].replace("tcp://*:", LOOPBACK_BIND)
    if config.get("replay_endpoint"):
        config["replay_endpoint"] = config["replay_endpoint"].replace("tcp://*:",
                                                                      "tcp://127.0.0.1:")
    out[at] = json.dumps(config)
    return out


def engine_argv(pool: Pool, url: str, python: str, model_dir: str) -> list[str]:
    """The command of the engine at ``url``: ridge's rendering of ``pool`` on its port and
    event ports, events on loopback."""
    port = urlsplit(url).port or 80
    settings = LaunchSettings(kv_events_ports=engine_event_ports(pool, url))
    return loopback_events(vllm_command(python, pool, port, model_dir, settings=settings))


def engine_env(base: Mapping[str, str], core: int) -> dict[str, str]:
    """The CPU engine's environment on ``core``, development endpoints on, and without
    ``PYTHONPATH`` (nothing of ridge's in vLLM's interpreter)."""
    env = vllm_env({k: v for k, v in base.items() if k != "PYTHONPATH"}, cpu_bind=str(core))
    env["VLLM_SERVER_DEV_MODE"] = "1"
    return env


async def start_engines(pool: Pool, workdir: Path, timeout_s: float) -> RealFleet:
    """Every endpoint of ``pool`` as a real engine, all healthy within ``timeout_s``, or
    RuntimeError with the failing engine's log tail (all stopped)."""
    python, model_dir = engine_paths(engines_dir())
    running = RealFleet()
    logs: list[Path] = []
    cores = os.cpu_count() or 1
    for i, url in enumerate(pool.endpoint_urls()):
        logs.append(workdir / f"vllm-{urlsplit(url).port}.log")
        with logs[-1].open("wb") as log:
            running.processes.append(subprocess.Popen(
                engine_argv(pool, url, python, model_dir), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=engine_env(os.environ, i % cores),
                start_new_session=True))
    try:
        await wait_healthy(pool.endpoint_urls(), running, logs, timeout_s)
    except BaseException:
        await running.stop()
        raise
    return running


async def wait_healthy(urls: Sequence[str], running: RealFleet, logs: Sequence[Path],
                       timeout_s: float) -> None:
    """Until every ``/health`` answers 200; RuntimeError when an engine exits or time is up."""
    deadline = time.monotonic() + timeout_s
    pending = set(urls)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
        while pending:
            for proc, log in zip(running.processes, logs, strict=True):
                if proc.poll() is not None:
                    raise RuntimeError(f"an engine exited during start-up:\n{tail(log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"engines not healthy after {timeout_s:.0f} s: "
                                   f"{sorted(pending)}")
            pending = {u for u in pending if not await answers(session, "GET", u + "/health")}
            await asyncio.sleep(1.0)


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


async def answers(session: aiohttp.ClientSession, method: str, url: str) -> Any:
    """The JSON answer of ``method url`` when it is 200 (``True`` when empty or not JSON),
    else None."""
    try:
        async with session.request(method, url) as resp:
            body = await resp.text() if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return None
    if body is None:
        return None
    try:
        return json.loads(body) if body.strip() else True
    except ValueError:
        return True


async def reset_prefix_caches(urls: Sequence[str]) -> None:
    """Empty every engine's prefix cache (``POST /reset_prefix_cache``; vLLM refuses while
    blocks are held by running requests, so it is retried), or RuntimeError."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10.0)) as session:
        for url in urls:
            for _ in range(RESET_TRIES):
                reply = await answers(session, "POST", url + "/reset_prefix_cache")
                if isinstance(reply, dict) and reply.get("success") is True:
                    break
                await asyncio.sleep(1.0)
            else:
                raise RuntimeError(f"{url} did not reset its prefix cache")


async def engine_version(url: str) -> str:
    """The engine's ``GET /version`` (``unknown`` when it does not say)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5.0)) as session:
        reply = await answers(session, "GET", url + "/version")
    return str(reply.get("version", "unknown")) if isinstance(reply, dict) else "unknown"
