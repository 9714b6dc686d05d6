"""Run ridge for real (uvicorn on a 127.0.0.1 port) inside a test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from backends.engines.dialects import EngineDialect
from backends.engines.facts import Facts
from backends.engines.probe import MetricsSource, ProbeError
from config.fleet import Fleet, parse_fleet
from gateway.app import create_app
from gateway.cli.main import listening_socket, uvicorn_config
from gateway.services import Gateway
from gateway.settings import Settings
from routing.snapshots import EngineMetrics

MODEL_FACTS = {
    "params": 1.35e8,
    "layers": 30,
    "hidden_size": 576,
    "kv_heads": 3,
    "head_dim": 64,
    "dtype_bytes": 4,
}
HARDWARE = {"name": "test", "peak_flops": 1e12, "mem_bandwidth": 1e11}


def fleet_of(
    pools: dict[str, list[str]], models: dict[str, list[str]] | None = None, engine: str = "vllm"
) -> Fleet:
    """A fleet of mixed pools: {pool name: [endpoint URLs]}; every pool serves model 'm'
    unless ``models`` says otherwise."""
    return parse_fleet(
        {
            "pools": [
                {
                    "name": name,
                    "engine": engine,
                    "models": (models or {}).get(name, ["m"]),
                    "endpoints": urls,
                    "model": MODEL_FACTS,
                    "hardware": HARDWARE,
                }
                for name, urls in pools.items()
            ]
        }
    )


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports on 127.0.0.1 that nothing listens on right now."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def ends_without_suspending(work: Coroutine[Any, Any, object]) -> bool:
    """Whether ``work`` runs to its end on its first step, never suspending (then nothing can
    cancel it midway); one that suspends is closed."""
    try:
        work.send(None)
    except StopIteration:
        return True
    work.close()
    return False


def closed_port_url() -> str:
    """A URL on which nothing listens (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@dataclass
class RunningRidge:
    url: str
    app: FastAPI
    metrics: CollectorRegistry

    @property
    def gateway(self) -> Gateway:
        gateway: Gateway = self.app.state.gateway
        return gateway


def quick_settings(**overrides: Any) -> Settings:
    base: dict[str, Any] = {
        "registry": {"poll_interval_s": 0.2, "probe_timeout_s": 1.0, "startup_wait_s": 3.0},
        "upstream": {
            "connect_timeout_s": 1.0,
            "first_byte_timeout_s": 5.0,
            "stream_idle_timeout_s": 5.0,
        },
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return Settings(**base)


@contextlib.asynccontextmanager
async def running_ridge(
    fleet: Fleet, settings: Settings | None = None
) -> AsyncIterator[RunningRidge]:
    """ridge serving ``fleet`` on a free port until the block ends."""
    metrics = CollectorRegistry()
    settings = (settings or quick_settings()).model_copy(update={"log_level": "warning"})
    app = create_app(settings, fleet, metrics_registry=metrics)
    sock = listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(app, settings))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("ridge stopped during start-up")
            await asyncio.sleep(0.02)
        yield RunningRidge(f"http://127.0.0.1:{port}", app, metrics)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 15)
        sock.close()


class DownProbe:
    """Finds every engine down: the gateway starts without talking to any."""

    async def health(self, url: str, dialect: EngineDialect) -> bool:
        raise ProbeError(url, "no engine in this test")

    async def metrics(self, url: str, dialect: EngineDialect) -> EngineMetrics:
        raise ProbeError(url, "no engine in this test")

    async def facts(self, url: str, dialect: EngineDialect) -> Facts:
        return {}


def down_probe(*_: object) -> MetricsSource:
    return DownProbe()
