from __future__ import annotations

import errno
import socket
from collections.abc import Iterator

import pytest

from backends.sim.fleet import RunningFleet, start_fleet
from config.fleet import Fleet
from gateway.cli import main as cli
from gateway.cli.demo_ports import (
    endpoint_urls,
    free_ports,
    port_in_use,
    port_taken,
    start_sim_fleet,
    taken_endpoints,
    with_ports,
)


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def _small_fleet(*ports: int) -> Fleet:
    """The demo fleet's first pool alone, its endpoints on ``ports``."""
    demo = cli._demo_fleet(None, cli.DEMO_FLEET)
    pool = demo.pools[0]
    fleet = demo.model_copy(update={"pools": [pool], "slos": {}})
    return with_ports(fleet, dict(zip(pool.endpoint_urls(), ports, strict=True)))


def test_port_taken_sees_a_listener_only(taken_port: int) -> None:
    assert port_taken("127.0.0.1", taken_port)
    assert not port_taken("127.0.0.1", free_ports("127.0.0.1", 1)[0])


def test_free_ports_are_distinct() -> None:
    ports = free_ports("127.0.0.1", 20)
    assert len(set(ports)) == 20 and all(p > 0 for p in ports)


def test_with_ports_moves_only_the_named_endpoints() -> None:
    fleet = _small_fleet(18101, 18102)
    moved = with_ports(fleet, {"http://127.0.0.1:18102": 40000})
    assert endpoint_urls(moved) == ["http://127.0.0.1:18101", "http://127.0.0.1:40000"]
    assert endpoint_urls(fleet) == ["http://127.0.0.1:18101", "http://127.0.0.1:18102"]


def test_taken_endpoints_are_found(taken_port: int) -> None:
    free = free_ports("127.0.0.1", 1)[0]
    fleet = _small_fleet(taken_port, free)
    assert taken_endpoints(fleet) == [f"http://127.0.0.1:{taken_port}"]


def test_port_in_use_looks_through_the_causes() -> None:
    inner = OSError(errno.EADDRINUSE, "Address already in use")
    try:
        raise OSError("pool 'spec': cannot listen") from inner
    except OSError as exc:
        assert port_in_use(exc)
    assert not port_in_use(OSError(errno.EACCES, "Permission denied"))


async def test_the_simulated_fleet_starts_off_a_taken_port(taken_port: int) -> None:
    free = free_ports("127.0.0.1", 1)[0]
    fleet = _small_fleet(taken_port, free)
    running, started, moved = await start_sim_fleet(fleet, start_fleet)
    try:
        assert moved == [f"http://127.0.0.1:{taken_port}"]
        assert running.urls == endpoint_urls(started)
        new = endpoint_urls(started)
        assert new[1] == f"http://127.0.0.1:{free}" and new[0] != moved[0]
    finally:
        await running.stop()


async def test_a_port_taken_meanwhile_moves_every_endpoint() -> None:
    fleet = _small_fleet(*free_ports("127.0.0.1", 2))
    seen: list[Fleet] = []

    async def start(wanted: Fleet) -> RunningFleet:
        seen.append(wanted)
        if len(seen) == 1:
            raise OSError("cannot listen") from OSError(errno.EADDRINUSE, "in use")
        return await start_fleet(wanted)

    running, started, moved = await start_sim_fleet(fleet, start)
    try:
        assert len(seen) == 2 and seen[0] == fleet and seen[1] == started
        assert moved == endpoint_urls(fleet)  # every endpoint, on ports chosen afresh
        assert running.urls == endpoint_urls(started)
    finally:
        await running.stop()


async def test_other_start_failures_are_not_retried() -> None:
    calls: list[Fleet] = []

    async def start(wanted: Fleet) -> None:
        calls.append(wanted)
        raise OSError(errno.EACCES, "Permission denied")

    with pytest.raises(PermissionError):
        await start_sim_fleet(_small_fleet(*free_ports("127.0.0.1", 2)), start)
    assert len(calls) == 1
