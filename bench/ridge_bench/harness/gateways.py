"""The gateways the overhead benchmark puts in front of the engine stand-in, and how each is
started (one process each, pinned to the gateway core by the caller).

- ``ridge``: ``ridge serve --config FLEET --port P``, every default setting (no ``RIDGE_*``
  variable), a fleet of one vLLM pool over the stand-in's endpoints (:func:`fleet`);
  ``ridge_src`` runs another source tree (``python -m gateway.cli serve`` there), e.g. an older
  commit. ``ridge-aiohttp`` (not by default): the same with the aiohttp upstream transport.
- ``fastapi``, ``aiohttp``, ``ridge-floor``: the bare pass-throughs of
  :mod:`ridge_bench.overhead.passthrough` (``ridge-floor``: ridge's own transport alone);
  ``asgi-uvicorn``, ``asgi-granian`` (not by default): its bare ASGI app on two servers.
- the Rust routers of :data:`ROUTERS`, round robin and cache_aware (``sglang-*``, ``smg-*``,
  ``vllm-*``): pinned, installed into :data:`BENCH_VENV` (:func:`router_python`; never a
  dependency of ridge or its tests), on 127.0.0.1, Prometheus on a free port (:func:`command`).

:func:`start` waits until the gateway is ready (:func:`ready`, :func:`router_ready`); the router
comparison and the capacity benchmark (:mod:`ridge_bench.compare.benchmark`) start the Rust
routers in front of their simulated fleets with it too (:func:`peer`).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import yaml

from ridge_bench.harness.procs import ROOT, Child, free_port, ridge_command, spawn
from ridge_bench.harness.upstream import MODEL, PACED_MODEL

SGLANG_ROUTER = "sglang-router==0.3.2"
SMG = "smg==1.13.0"
VLLM_ROUTER = "vllm-router==0.1.17"
BENCH_VENV = ROOT / ".bench-venv"
"""The benchmarks' own virtual environment: every router of :data:`ROUTERS` is installed
there (their dependencies do not conflict); never ridge's ``.venv``."""
INSTALL_TIMEOUT_S = 900.0
POLICY_NAMES = {"round_robin": "round robin", "cache_aware": "cache_aware"}


@dataclass(frozen=True)
class RustRouter:
    """A Rust router from PyPI: its kind, the name its rows carry, its pinned requirement
    (``DISTRIBUTION==VERSION``) and the module ``python -m`` starts."""

    kind: str
    name: str
    requirement: str
    module: str

    @property
    def distribution(self) -> str:
        return self.requirement.split("==")[0]

    @property
    def version(self) -> str:
        return self.requirement.split("==")[1]

    def label(self, policy: str) -> str:
        """The row label of this router with ``policy``."""
        return f"{self.name} {self.version}, {POLICY_NAMES.get(policy, policy)}"


ROUTERS: Mapping[str, RustRouter] = {r.kind: r for r in (
    RustRouter("sglang", "SGLang router", SGLANG_ROUTER, "sglang_router.launch_router"),
    RustRouter("smg", "smg", SMG, "smg.launch_router"),
    RustRouter("vllm-router", "vLLM router", VLLM_ROUTER, "vllm_router.launch_router"),
)}
"""Every router kind → its :class:`RustRouter`; a :class:`Gateway` of such a kind runs it."""


@dataclass(frozen=True)
class Gateway:
    """One gateway under test: its key, its label in the tables, and how it starts."""

    key: str
    label: str
    kind: str  # "ridge" | "passthrough" | a key of ROUTERS
    arg: str = ""  # the pass-through's server, a router's policy, ridge's transport
    workers: int = 1  # ridge: ``--workers``


def router_gateways(prefix: str, kind: str) -> tuple[Gateway, Gateway]:
    """``PREFIX-rr`` and ``PREFIX-ca``: the router of ``kind``, round robin and cache_aware."""
    router = ROUTERS[kind]
    return (Gateway(f"{prefix}-rr", router.label("round_robin"), kind, "round_robin"),
            Gateway(f"{prefix}-ca", router.label("cache_aware"), kind, "cache_aware"))


GATEWAYS: tuple[Gateway, ...] = (
    Gateway("ridge", "ridge, default settings", "ridge"),
    Gateway("fastapi", "FastAPI + aiohttp client, no routing", "passthrough", "fastapi"),
    Gateway("aiohttp", "aiohttp.web + aiohttp client, no routing", "passthrough", "aiohttp"),
    Gateway("ridge-floor", "ridge's front door + upstream client, no routing", "passthrough",
            "ridge"),
    *router_gateways("sglang", "sglang"),
    *router_gateways("smg", "smg"),
    *router_gateways("vllm", "vllm-router"),
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
    each router's interpreter (None: not available)."""

    ridge_src: Path | None = None
    sglang_python: Path | None = None
    smg_python: Path | None = None
    vllm_router_python: Path | None = None

    def python(self, kind: str) -> Path | None:
        """The interpreter that runs the router of ``kind`` (None: not available)."""
        name = _PYTHON_FIELDS.get(kind)
        return None if name is None else getattr(self, name)

    def with_python(self, kind: str, python: Path) -> Launch:
        """This launch with ``python`` running the router of ``kind``."""
        return replace(self, **{_PYTHON_FIELDS[kind]: python})


_PYTHON_FIELDS: Mapping[str, str] = MappingProxyType({
    "sglang": "sglang_python", "smg": "smg_python", "vllm-router": "vllm_router_python"})
"""Router kind → the :class:`Launch` field holding its interpreter."""


def peer(kind: str, policy: str) -> Gateway:
    """The router of ``kind`` with ``policy`` in front of a simulated fleet; its child process
    and log are named ``kind``."""
    return Gateway(kind, ROUTERS[kind].label(policy), kind, policy)


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
            workdir: Path, router_args: Sequence[str] = ()
            ) -> tuple[list[str], dict[str, str], Path]:
    """argv, extra environment and working directory of ``gateway`` on ``port``. A router:
    ``python -m MODULE --host 127.0.0.1 --port P --worker-urls URL... --policy POLICY
    --prometheus-port FREE --prometheus-host 127.0.0.1`` (the same flags for all three),
    then ``router_args`` (its policy's own flags), with nothing of ridge's on its import
    path."""
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
    router = ROUTERS[gateway.kind]
    python = launch.python(gateway.kind)
    if python is None:
        raise RuntimeError(f"the {router.name} ({router.requirement}) is not installed")
    argv = [str(python), "-m", router.module, "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *urls, "--policy", gateway.arg,
            "--prometheus-port", str(free_port()), "--prometheus-host", "127.0.0.1",
            *router_args]
    return argv, {"PYTHONPATH": ""}, workdir


async def start(gateway: Gateway, launch: Launch, urls: Sequence[str], workdir: Path,
                cpus: Sequence[int] | None, timeout_s: float, model: str = MODEL,
                smg_alias: str | None = PACED_MODEL, router_args: Sequence[str] = ()) -> Child:
    """``gateway`` on a free port (a router with ``router_args``: :func:`command`), answering
    a completion for ``model`` (:func:`ready`; a router also :func:`router_ready`, with
    ``smg_alias``), or RuntimeError with its log; the process is stopped if waiting fails in
    any way."""
    port = free_port()
    argv, env, cwd = command(gateway, launch, port, urls, workdir, router_args)
    child = await spawn(gateway.key, argv, workdir, env, cwd=cwd, cpus=cpus, drop_prefix="RIDGE_")
    child.url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    try:
        answered = await ready(child, timeout_s, model)
        if answered and gateway.kind in ROUTERS:
            answered = await router_ready(child, gateway.kind, urls, deadline - time.monotonic(),
                                          smg_alias)
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


def alias_url(url: str) -> str:
    """``url`` (on 127.0.0.1) with its host named ``localhost``: the same endpoint under
    another URL, which smg takes as another worker."""
    parts = urlsplit(url)
    if parts.hostname != "127.0.0.1" or parts.port is None:
        raise ValueError(f"not an endpoint on 127.0.0.1: {url}")
    return f"{parts.scheme}://localhost:{parts.port}{parts.path.rstrip('/')}"


def smg_worker(url: str, model: str = PACED_MODEL) -> dict[str, Any]:
    """What ``POST /workers`` sends smg: the endpoint at ``url`` as :func:`alias_url`,
    serving ``model``."""
    return {"url": alias_url(url), "models": [{"id": model}]}


def serving(listing: Mapping[str, Any]) -> int:
    """How many workers a router's ``GET /workers`` answer lists as serving: smg's with
    status ``ready``, the others' (no status) healthy."""
    return sum(1 for w in listing.get("workers", [])
               if (w.get("status") == "ready" if "status" in w else w.get("is_healthy") is True))


async def router_ready(child: Child, kind: str, urls: Sequence[str], timeout_s: float,
                       smg_alias: str | None = PACED_MODEL) -> bool:
    """After :func:`ready`: whether the router of ``kind`` lists every worker as serving
    (:func:`serving`) within ``timeout_s``. The SGLang router and smg answer once a worker is
    registered, before the others are; vLLM's router listens only once all are healthy. smg
    registers an HTTP worker under the first model its ``/v1/models`` lists, routes by that
    exact name (``--model-alias`` does not apply to HTTP workers) and takes each URL once: so
    for a second model, ``smg_alias`` (the stand-in's paced one; None: none, as a simulated
    fleet of one model), its workers are added first (:func:`smg_worker`) and it must answer
    for it."""
    deadline = time.monotonic() + timeout_s
    alias = smg_alias if kind == "smg" else None
    wanted = len(urls) * (1 if alias is None else 2)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
        if alias is not None and not await _add_smg_workers(session, child.url, urls, alias):
            return False
        while await _serving(session, child.url) < wanted:
            if time.monotonic() >= deadline or child.proc.returncode is not None:
                return False
            await asyncio.sleep(0.25)
    return alias is None or await ready(child, deadline - time.monotonic(), alias)


async def _add_smg_workers(session: aiohttp.ClientSession, base: str, urls: Sequence[str],
                           model: str) -> bool:
    try:
        for url in urls:
            async with session.post(base + "/workers", json=smg_worker(url, model)) as resp:
                await resp.read()
                if resp.status not in (200, 201, 202, 409):  # 409: already there
                    return False
    except (aiohttp.ClientError, TimeoutError):
        return False
    return True


async def _serving(session: aiohttp.ClientSession, base: str) -> int:
    try:
        async with session.get(base + "/workers") as resp:
            listing = await resp.json(content_type=None) if resp.status == 200 else {}
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return 0
    return serving(listing) if isinstance(listing, dict) else 0


def install_plan(router: RustRouter, venv: Path = BENCH_VENV) -> list[list[str]]:
    """The commands that put ``router`` into ``venv``: create it when it has no interpreter,
    then ``pip install`` the pinned requirement (nothing else of the environment changes)."""
    python = venv / "bin" / "python"
    create = [] if python.exists() else [[sys.executable, "-m", "venv", str(venv)]]
    return [*create, [str(python), "-m", "pip", "install", "-q", router.requirement]]


def router_python(router: RustRouter, install: bool, log: Path,
                  venv: Path = BENCH_VENV) -> tuple[Path | None, str]:
    """The interpreter of ``venv`` with ``router`` at its pinned version importable,
    installing it there first when ``install`` (:func:`install_plan`, each step bounded by
    :data:`INSTALL_TIMEOUT_S`, output to ``log``); else None and why."""
    python = venv / "bin" / "python"
    if _imports(python, router):
        return python, ""
    if not install:
        return None, f"not installed in {venv.name}/ (and --no-install)"
    with log.open("ab") as out:
        for argv in install_plan(router, venv):
            try:
                done = subprocess.run(argv, stdout=out, stderr=out, timeout=INSTALL_TIMEOUT_S,
                                      check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                return None, f"cannot install {router.requirement}: {exc}"
            if done.returncode != 0:
                return None, f"cannot install {router.requirement} (see {log.name})"
    if _imports(python, router):
        return python, ""
    return None, f"{router.requirement} installed but does not import (see {log.name})"


def import_check(router: RustRouter) -> str:
    """Python that exits 0 only where ``router``'s module imports at its pinned version."""
    return (f"import importlib.metadata as m, {router.module}; "
            f"raise SystemExit(m.version({router.distribution!r}) != {router.version!r})")


def _imports(python: Path, router: RustRouter) -> bool:
    if not python.exists():
        return False
    try:
        done = subprocess.run([str(python), "-c", import_check(router)], capture_output=True,
                              timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0
