"""The simulator's ``reset`` and ``close`` faults, and clients that leave, on both event loops:
asyncio's own and uvloop, which ``ridge demo`` runs on (:func:`gateway.cli.main.run`).

In-process tests start the fleet on a fresh loop of each kind, as the command does (a runner
with that loop's factory), and talk to it over raw HTTP/1.1 from a worker thread, so what the
client sees is exact: a reset is ``ConnectionResetError``, a clean end is an EOF. The last test
runs the faults through a real ``ridge demo`` process, talking to one of its simulated engines.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import uvloop
import yaml

from backends.sim import RunningFleet, start_fleet
from config.fleet import parse_fleet
from tests.fakes.harness import free_ports
from tests.real_engine.servers import Server, ridge_binary, spawn

MODEL = "smollm2-135m"
SPEED = 20.0
IO_TIMEOUT_S = 60.0  # a generous bound on one socket operation on a loaded machine
WAIT_S = 60.0  # a generous bound on waiting for the fleet to reach a state
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
LONG_STREAM = {"model": MODEL, "prompt": "x", "max_tokens": 4000, "stream": True}

pytestmark = pytest.mark.timeout(180)


def _fleet_raw(ports: list[int]) -> dict[str, Any]:
    facts = {"params": 8.03e9, "layers": 32, "hidden_size": 4096, "kv_heads": 8,
             "head_dim": 128, "dtype_bytes": 2, "max_context": 8192}
    hardware = {"name": "l4", "peak_flops": 121e12, "mem_bandwidth": 300e9}
    return {"pools": [{"name": f"p{i}", "engine": "vllm", "models": [MODEL],
                       "endpoints": [f"http://127.0.0.1:{port}"], "model": facts,
                       "hardware": hardware} for i, port in enumerate(ports)]}


def run_on(loop: str, scenario: Callable[[RunningFleet], Awaitable[None]]) -> None:
    """``scenario`` against a one-endpoint fleet, both on a fresh event loop of kind ``loop``."""

    async def main() -> None:
        assert type(asyncio.get_running_loop()).__module__.startswith(loop)
        fleet = await start_fleet(parse_fleet(_fleet_raw(free_ports(1))), speed=SPEED, seed=1)
        try:
            await scenario(fleet)
        finally:
            await fleet.stop()

    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        runner.run(main())


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def http_request(method: str, path: str, body: dict[str, Any] | None = None) -> bytes:
    """One HTTP/1.1 request that asks the server to close the connection after its answer."""
    data = b"" if body is None else json.dumps(body).encode()
    head = (f"{method} {path} HTTP/1.1\r\nHost: sim\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n")
    return head.encode() + data


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT_S)


def read_to_end(port: int, request: bytes,
                answering: Callable[[], None] = lambda: None) -> tuple[bytes, str]:
    """Send ``request`` and read until the connection ends (``answering()`` once the answer's
    first bytes are in): what came, and how it ended (``eof`` or ``reset``)."""
    got = b""
    with _connect(port) as sock:
        sock.sendall(request)
        try:
            while chunk := sock.recv(65536):
                if not got:
                    answering()
                got += chunk
        except ConnectionResetError:
            return got, "reset"
    return got, "eof"


def fault(port: int, **body: Any) -> None:
    """Set a fault through the admin API (a ``close`` may reset this very connection once its
    answer is out, so only the answer is checked)."""
    got, _ = read_to_end(port, http_request("POST", "/sim/fault", body))
    assert got.startswith(b"HTTP/1.1 200"), got


def leave(port: int, request: bytes, when: str) -> None:
    """Send ``request`` and go away: ``at-once`` (a FIN right behind the request) or
    ``mid-stream`` (after the first SSE event, with a reset)."""
    with _connect(port) as sock:
        sock.sendall(request)
        if when == "mid-stream":
            got = b""
            while b"data:" not in got:
                chunk = sock.recv(65536)
                assert chunk, got
                got += chunk
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def refused(port: int) -> bool:
    """Whether a new connection to ``port`` is refused."""
    try:
        read_to_end(port, http_request("GET", "/health"))
    except ConnectionRefusedError:
        return True
    return False


async def until(check: Callable[[], bool]) -> None:
    """Wait (bounded by WAIT_S) until ``check()`` holds."""
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, "the fleet did not reach the expected state"
        await asyncio.sleep(0.02)


def _idle(fleet: RunningFleet) -> Callable[[], bool]:
    core = fleet.servers[0].endpoint.core
    return lambda: core.num_running == 0 and core.num_waiting == 0


def sse_events(got: bytes) -> int:
    return got.count(b"data:")


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_the_reset_fault_resets_streamed_and_whole_answers(loop: str) -> None:
    async def scenario(fleet: RunningFleet) -> None:
        port = _port(fleet.urls[0])
        stream = http_request("POST", "/v1/completions", {**LONG_STREAM, "max_tokens": 40})
        await asyncio.to_thread(fault, port, kind="reset", after_chunks=1, count=1)
        got, end = await asyncio.to_thread(read_to_end, port, stream)
        assert end == "reset" and got.startswith(b"HTTP/1.1 200")
        assert sse_events(got) <= 1 and b"[DONE]" not in got
        whole = http_request("POST", "/v1/completions",
                             {"model": MODEL, "prompt": "x", "max_tokens": 3})
        await asyncio.to_thread(fault, port, kind="reset", count=1)
        assert await asyncio.to_thread(read_to_end, port, whole) == (b"", "reset")
        got, end = await asyncio.to_thread(read_to_end, port, whole)  # count=1: used up
        assert end == "eof" and got.startswith(b"HTTP/1.1 200")

    run_on(loop, scenario)


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_the_close_fault_resets_open_streams_and_refuses_connections(loop: str) -> None:
    async def scenario(fleet: RunningFleet) -> None:
        port = _port(fleet.urls[0])
        answering = threading.Event()
        reader = asyncio.create_task(asyncio.to_thread(
            read_to_end, port, http_request("POST", "/v1/completions", LONG_STREAM),
            answering.set))
        assert await asyncio.to_thread(answering.wait, IO_TIMEOUT_S)
        # long enough never to end by itself here: the test reopens the endpoint
        await asyncio.to_thread(fault, port, kind="close", duration_s=3600)
        got, end = await reader
        assert end == "reset" and got.startswith(b"HTTP/1.1 200") and b"[DONE]" not in got
        assert await asyncio.to_thread(refused, port)
        await fleet.servers[0].reopen()
        got, end = await asyncio.to_thread(read_to_end, port, http_request("GET", "/health"))
        assert end == "eof" and got.startswith(b"HTTP/1.1 200")

    run_on(loop, scenario)


@pytest.mark.parametrize("when", ["at-once", "mid-stream"])
@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_client_leaving_a_stream_logs_no_traceback(
        loop: str, when: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)

    async def scenario(fleet: RunningFleet) -> None:
        port = _port(fleet.urls[0])
        for path, body in (("/v1/completions", LONG_STREAM),
                           ("/v1/responses", {"model": MODEL, "input": "x", "stream": True,
                                              "max_output_tokens": 4000})):
            await asyncio.to_thread(leave, port, http_request("POST", path, body), when)
            await until(_idle(fleet))  # the request was aborted in the engine
        await asyncio.sleep(0.1)  # let the handlers' last lines out

    run_on(loop, scenario)
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING], \
        caplog.text
    assert "Traceback" not in caplog.text
    mine = [r for r in caplog.records if r.name == "backends.sim.wire"]
    assert len(mine) <= 2 and all(r.levelno == logging.DEBUG for r in mine)


def _demo_engine_port(demo: Server) -> int:
    """The port of the demo's simulated engine, from its banner (waited for, bounded)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = re.search(r"pool p0 .* port\(s\) (\d+)", demo.log_path.read_text())
        if found:
            return int(found.group(1))
        assert demo.alive(), demo.log_tail()
        time.sleep(0.2)
    raise AssertionError(f"no demo banner in {WAIT_S:.0f} s:\n{demo.log_tail()}")


def test_the_faults_under_ridge_demo(tmp_path: Path) -> None:
    """``ridge demo`` runs its simulated fleet on uvloop: the faults reset there too, and a
    client that leaves leaves no traceback in the demo's output."""
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(yaml.safe_dump(_fleet_raw(free_ports(1))))
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("RIDGE_")}
    demo = spawn("demo", [str(ridge_binary()), "demo", "--config", str(fleet_file), "--port",
                          "0", "--speed", str(SPEED)], {**env, "RIDGE_DRAIN_S": "0"},
                 tmp_path, url="")
    try:
        port = _demo_engine_port(demo)
        _demo_checks(port)
    finally:
        demo.signal_group(signal.SIGTERM)
        demo.stop()
    log = demo.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "Error handling request" not in log, log


def _demo_checks(port: int) -> None:
    """``reset`` on a stream, two clients leaving, ``close`` under an open stream."""
    stream = http_request("POST", "/v1/completions", {**LONG_STREAM, "max_tokens": 40})
    fault(port, kind="reset", after_chunks=1, count=1)
    got, end = read_to_end(port, stream)
    assert end == "reset" and sse_events(got) <= 1 and b"[DONE]" not in got
    for when in ("at-once", "mid-stream"):
        leave(port, http_request("POST", "/v1/completions", LONG_STREAM), when)
    answering = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        reader = pool.submit(read_to_end, port, http_request("POST", "/v1/completions",
                                                             LONG_STREAM), answering.set)
        assert answering.wait(IO_TIMEOUT_S)
        fault(port, kind="close", duration_s=3600)
        got, end = reader.result(IO_TIMEOUT_S)
    assert end == "reset" and got.startswith(b"HTTP/1.1 200") and b"[DONE]" not in got
    assert refused(port)

