"""The drain step in front of uvicorn's graceful shutdown (the server is not started)."""

from __future__ import annotations

import asyncio
import signal

import uvicorn

from gateway.server.shutdown import DrainingServer, Lifecycle


def server(drain_s: float) -> tuple[DrainingServer, Lifecycle]:
    lifecycle = Lifecycle()
    made = DrainingServer(uvicorn.Config(app=None), lifecycle, drain_s)  # type: ignore[arg-type]
    made._loop = asyncio.get_running_loop()
    return made, lifecycle


async def test_sigterm_drains_first_then_stops() -> None:
    made, lifecycle = server(0.2)
    made.handle_exit(signal.SIGTERM, None)
    await asyncio.sleep(0)  # the drain starts on the loop
    assert lifecycle.draining and not made.should_exit
    for _ in range(100):
        if made.should_exit:
            break
        await asyncio.sleep(0.05)
    assert made.should_exit


async def test_a_second_sigterm_or_sigint_stops_at_once() -> None:
    made, lifecycle = server(3600.0)
    made.handle_exit(signal.SIGTERM, None)
    made.handle_exit(signal.SIGTERM, None)
    assert lifecycle.draining and made.should_exit
    made, lifecycle = server(3600.0)
    made.handle_exit(signal.SIGINT, None)
    assert made.should_exit and not lifecycle.draining


async def test_no_drain_stops_at_once() -> None:
    made, lifecycle = server(0.0)
    made.handle_exit(signal.SIGTERM, None)
    assert made.should_exit and not lifecycle.draining
