"""Engine ports for ``ridge demo``, so that a second demo on the same machine starts as well.

The demo fleet files name fixed ports (127.0.0.1:18101-18109). Before the engines start,
:func:`free_engine_ports` moves every endpoint whose port something already listens on to a
free port the kernel picks (all chosen while held, so they are distinct), and the gateway is
given the fleet as moved. :func:`start_sim_fleet` starts the simulated engines so; when another
process takes a port between the check and the bind (two demos started at the same moment), it
starts again with every endpoint on a free port (at most :data:`ATTEMPTS` starts).
"""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar
from urllib.parse import urlsplit

from pydantic import AnyHttpUrl

from config.fleet import Fleet

ATTEMPTS = 3
"""Starts of the simulated fleet before a port taken meanwhile is reported."""

R = TypeVar("R")

SIM_HOST = "127.0.0.1"
"""Where the simulated engines listen, whatever host their URLs name (backends.sim.fleet)."""


def port_taken(host: str, port: int) -> bool:
    """Whether binding ``host:port`` fails now (with SO_REUSEADDR, as the engines bind: a port
    left in TIME_WAIT is free, one another socket listens on is not)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct ports free on ``host`` right now (each held until all are chosen)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def endpoint_urls(fleet: Fleet) -> list[str]:
    return [url for pool in fleet.pools for url in pool.endpoint_urls()]


def taken_endpoints(fleet: Fleet, host: str = SIM_HOST) -> list[str]:
    """The endpoint URLs of ``fleet`` whose port is taken on ``host``."""
    return [url for url in endpoint_urls(fleet) if port_taken(host, _port(url))]


def with_ports(fleet: Fleet, ports: Mapping[str, int]) -> Fleet:
    """``fleet`` with the endpoints named in ``ports`` (URL → new port) moved there."""
    pools = []
    for pool in fleet.pools:
        urls = [_with_port(url, ports[url]) if url in ports else url
                for url in pool.endpoint_urls()]
        pools.append(pool.model_copy(update={"endpoints": [AnyHttpUrl(u) for u in urls]}))
    return fleet.model_copy(update={"pools": pools})


def free_engine_ports(fleet: Fleet, urls: Sequence[str], host: str = SIM_HOST) -> Fleet:
    """``fleet`` with the endpoints ``urls`` moved to free ports of ``host``."""
    return with_ports(fleet, dict(zip(urls, free_ports(host, len(urls)), strict=True)))


def _port(url: str) -> int:
    return urlsplit(url).port or 80


def _with_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else parts.hostname
    return parts._replace(netloc=f"{host}:{port}").geturl()


def port_in_use(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is "address already in use"."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE:
            return True
        cause = cause.__cause__
    return False


async def start_sim_fleet(
    fleet: Fleet, start: Callable[[Fleet], Awaitable[R]]
) -> tuple[R, Fleet, list[str]]:
    """``start`` the simulated ``fleet`` with its taken ports moved to free ones; what
    ``start`` returned, the fleet as started, and the configured URLs that were moved."""
    moved = taken_endpoints(fleet)
    for _ in range(ATTEMPTS - 1):
        started = free_engine_ports(fleet, moved)
        try:
            return await start(started), started, moved
        except OSError as exc:
            if not port_in_use(exc):
                raise
        moved = endpoint_urls(fleet)  # one was taken meanwhile: every endpoint on a free port
    started = free_engine_ports(fleet, moved)
    return await start(started), started, moved
