"""Start and stop real vLLM engines and a ridge gateway as subprocesses, for the real-engine tier.

Every server binds 127.0.0.1 on a free port, runs in its own process group (so stopping it
also stops vLLM's engine-core and worker children) and writes its output to a log file whose
tail goes into any start-up failure message.

- :func:`engine_paths` finds the environment built by ``deploy/vllm-cpu/setup.sh`` (or raises
  :class:`MissingEngines` saying to run it);
- :func:`real_fleet` builds a fleet (``config.fleet``) of one-endpoint vLLM pools on free
  ports, :func:`start_vllm_pools` launches one engine per pool, all at once, with the flags
  ``backends.launch.vllm`` renders from the pool's levers, and waits for every ``/health``;
- :func:`start_ridge` runs ``ridge serve --config FLEET.yaml`` and waits for ``/ready``;
- :meth:`Server.stop` sends SIGTERM to the group, then SIGKILL after a grace period;
  :meth:`Server.kill` sends SIGKILL at once (an engine crash).

Every wait is bounded by a deadline; a server process that exits while being waited for ends
the wait at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from backends.launch.vllm import vllm_command, vllm_env
from backends.sim.profiles import HARDWARE
from config.fleet import Fleet, parse_fleet
from config.pools import Pool

ROOT = Path(__file__).resolve().parents[2]
SETUP_SCRIPT = "deploy/vllm-cpu/setup.sh"
STAMP = ".ridge-stamp"  # written by setup.sh when a part is complete
MODEL = "smollm2-135m"

SMOLLM2_FACTS: Mapping[str, float] = {
    "params": 1.35e8, "layers": 30, "hidden_size": 576, "kv_heads": 3, "head_dim": 64,
    "dtype_bytes": 4, "max_context": 2048,
}  # fmt: skip
"""SmolLM2-135M as served here: counts, and bytes per element (float32)."""

CPU_FACTS: Mapping[str, Any] = {"name": "cpu-smollm2",
                                "peak_flops": HARDWARE["cpu-smollm2"].facts.peak_flops,
                                "mem_bandwidth": HARDWARE["cpu-smollm2"].facts.mem_bandwidth}
"""This machine kind: effective FLOP/s and bytes/s of one core, the simulator's profile
calibrated on these engines (``backends/sim/profiles``; ``ridge bench calibrate`` refits it)."""


class MissingEngines(RuntimeError):
    """The real-engine environment has not been built."""


class StartupError(RuntimeError):
    """A server did not become ready in time; the message carries its log tail."""


@dataclass(frozen=True, slots=True)
class EnginePaths:
    """The vLLM virtual environment's interpreter and the converted model folder."""

    python: Path
    model_dir: Path


def engine_paths(engines_dir: Path | None = None) -> EnginePaths:
    """Where setup.sh put vLLM and the model (``RIDGE_ENGINES_DIR`` or ``.engines``).

    setup.sh writes each part's stamp file last, so a missing stamp means a missing or half-built
    part.
    """
    base = engines_dir or Path(os.environ.get("RIDGE_ENGINES_DIR", ROOT / ".engines"))
    paths = EnginePaths(base / "vllm-venv" / "bin" / "python", base / "smollm2-135m")
    stamps = (paths.python.parent.parent / STAMP, paths.model_dir / STAMP)
    missing = [str(p.parent) for p in stamps if not p.exists()]
    if missing:
        raise MissingEngines(
            f"the real-engine environment is missing or incomplete ({', '.join(missing)}): "
            f"run `bash {SETUP_SCRIPT}` first (make test runs it)"
        )
    return paths


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Server:
    """One server subprocess (its own process group) and its log file."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the process group, SIGKILL if it is still there after ``grace_s``."""
        self.signal_group(signal.SIGTERM)
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.signal_group(signal.SIGKILL)
            self.process.wait(timeout=grace_s)
        self.signal_group(signal.SIGKILL)  # children that outlived the leader

    def kill(self) -> None:
        """SIGKILL to the whole group at once, as a crash would."""
        self.signal_group(signal.SIGKILL)
        self.process.wait(timeout=30)

    def signal_group(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the server's process group (the server and its children)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)


def spawn(name: str, argv: Sequence[str], env: Mapping[str, str], log_dir: Path,
          url: str) -> Server:
    """Start ``argv`` in a new process group with output to ``log_dir/name.log``."""
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            list(argv), env=dict(env), stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, cwd=ROOT, start_new_session=True,
        )  # fmt: skip
    return Server(name, url, process, log_path)


def answers_200(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def wait_ready(servers: Sequence[Server], path: str, timeout_s: float,
               ready: Callable[[str], bool] = answers_200) -> None:
    """Wait until every server answers ``path`` with 200; raise StartupError on timeout or exit."""
    deadline = time.monotonic() + timeout_s
    pending = list(servers)
    while pending:
        for server in list(pending):
            if not server.alive():
                code = server.process.returncode
                raise StartupError(_failure(server, f"exited with code {code}"))
            if ready(server.url + path):
                pending.remove(server)
        if pending and time.monotonic() > deadline:
            raise StartupError("\n".join(_failure(s, f"not ready after {timeout_s:.0f} s")
                                         for s in pending))
        if pending:
            time.sleep(0.5)


def _failure(server: Server, what: str) -> str:
    return f"{server.name} ({server.url}) {what}; log {server.log_path}:\n{server.log_tail()}"


def pool_entry(name: str, models: Sequence[str], ports: Sequence[int],
               levers: Mapping[str, Any]) -> dict[str, Any]:
    """One fleet-file pool of SmolLM2 engines on this CPU."""
    return {
        "name": name, "engine": "vllm", "models": list(models),
        "endpoints": [f"http://127.0.0.1:{p}" for p in ports], "levers": dict(levers),
        "model": dict(SMOLLM2_FACTS), "hardware": dict(CPU_FACTS),
    }  # fmt: skip


def real_fleet(pools: Sequence[Mapping[str, Any]]) -> tuple[Fleet, dict[str, Any]]:
    """The validated fleet and its raw form (for writing a fleet file)."""
    raw = {"pools": [dict(p) for p in pools]}
    return parse_fleet(raw, source="real-engine fleet"), raw


def write_fleet(raw: Mapping[str, Any], path: Path) -> Path:
    path.write_text(yaml.safe_dump(dict(raw), sort_keys=False))
    return path


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


def start_vllm_pools(pools: Sequence[Pool], paths: EnginePaths, log_dir: Path,
                     cpu_binds: Sequence[str | None], timeout_s: float = 240.0) -> list[Server]:
    """One engine per pool (its first endpoint), started together; all healthy or all stopped."""
    servers: list[Server] = []
    try:
        for pool, bind in zip(pools, cpu_binds, strict=True):
            url = pool.endpoint_urls()[0]
            argv = vllm_command(str(paths.python), pool, port_of(url), str(paths.model_dir))
            env = vllm_env(os.environ, kv_cache_gib=1, cpu_bind=bind)
            servers.append(spawn(f"vllm-{pool.name}", argv, env, log_dir, url))
        wait_ready(servers, "/health", timeout_s)
    except BaseException:
        stop_all(servers)
        raise
    return servers


def stop_all(servers: Sequence[Server]) -> None:
    """Stop every server, SIGTERM first to all of them, then wait for each."""
    for server in servers:
        server.signal_group(signal.SIGTERM)
    for server in servers:
        server.stop()


def ridge_binary() -> Path:
    return ROOT / ".venv" / "bin" / "ridge"


def start_ridge(fleet_file: Path, log_dir: Path, name: str = "ridge",
                env: Mapping[str, str] | None = None, timeout_s: float = 60.0,
                args: Sequence[str] = ()) -> Server:
    """``ridge serve`` on a free port (``args``: more of its options), waited for until
    ``/ready`` answers 200. It stops at once on SIGTERM (no drain) unless ``env`` sets
    ``RIDGE_DRAIN_S``."""
    binary = ridge_binary()
    if not binary.exists():
        raise StartupError(f"{binary} does not exist: install the project (pip install -e .)")
    port = free_port()
    argv = [str(binary), "serve", "--config", str(fleet_file), "--host", "127.0.0.1",
            "--port", str(port), *args]
    server = spawn(name, argv, {**os.environ, "RIDGE_DRAIN_S": "0", **(env or {})}, log_dir,
                   f"http://127.0.0.1:{port}")
    try:
        wait_ready([server], "/ready", timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


@contextlib.contextmanager
def one_engine_and_ridge(entry: Mapping[str, Any], logs: Path, start_timeout_s: float = 300.0,
                         fleet_extra: Mapping[str, Any] | None = None,
                         ridge_env: Mapping[str, str] | None = None,
                         ) -> Iterator[tuple[Server, Server]]:
    """One vLLM engine for the fleet-file pool ``entry`` (its first endpoint's port), started
    from the pool's own command line, and ridge in front of it: (engine, ridge); both stopped
    at the end. ``fleet_extra``: more top-level fleet-file keys (e.g. ``routing``);
    ``ridge_env``: more of ridge's settings. For modules that need an engine of their own
    (they sort before the tier's shared engines start, so at most two are ever up)."""
    paths = engine_paths()
    fleet, raw = real_fleet([entry])
    raw.update(fleet_extra or {})
    pool = fleet.pools[0]
    url = pool.endpoint_urls()[0]
    argv = vllm_command(str(paths.python), pool, port_of(url), str(paths.model_dir))
    started = time.monotonic()
    engine = spawn(f"vllm-{pool.name}", argv, vllm_env(os.environ, kv_cache_gib=1), logs, url)
    servers = [engine]
    try:
        wait_ready([engine], "/health", start_timeout_s)
        print(f"\nvLLM {pool.name} healthy in {time.monotonic() - started:.1f} s")
        servers.append(start_ridge(write_fleet(raw, logs / "fleet.yaml"), logs,
                                   env={"RIDGE_REGISTRY__POLL_INTERVAL_S": "0.5",
                                        **(ridge_env or {})}))
        yield engine, servers[1]
    finally:
        stop_all(servers)
        print(f"\nvLLM {pool.name} and ridge up for {time.monotonic() - started:.1f} s")
