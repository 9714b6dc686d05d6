"""Stopping without dropping requests: drain, then stop.

Algorithm. On SIGTERM (what an orchestrator sends to stop a process):

1. **Drain** for ``drain_s`` seconds: ``/ready`` answers 503 at once (:class:`Lifecycle`), so
   load balancers and Kubernetes take the gateway out of rotation, while it goes on serving
   every request that still arrives, on new connections too — the balancers' own view lags
   by a probe period.
2. **Stop**: uvicorn's graceful shutdown — the listener closes, idle connections close, and
   requests in flight get up to the shutdown timeout (``RIDGE_SHUTDOWN_TIMEOUT_S``) to finish
   before they are cut; then the process exits.

A second SIGTERM, or SIGINT (Ctrl-C), skips what is left of the drain. With ``drain_s`` = 0
SIGTERM stops at once, as uvicorn does by itself. ``ridge serve --workers N``: the supervisor
passes SIGTERM to every worker, each drains and stops the same way.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from dataclasses import dataclass
from types import FrameType

import uvicorn  # Server internals: pinned in pyproject.toml, test_shutdown_pins.py

log = logging.getLogger("ridge")


@dataclass
class Lifecycle:
    """Whether the gateway was told to stop and is draining (``/ready`` then answers 503)."""

    draining: bool = False


class DrainingServer(uvicorn.Server):
    """uvicorn's server with the drain step before its graceful shutdown (module docstring)."""

    def __init__(self, config: uvicorn.Config, lifecycle: Lifecycle, drain_s: float) -> None:
        super().__init__(config)
        self.lifecycle = lifecycle
        self.drain_s = drain_s
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets=sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig != signal.SIGTERM or self.lifecycle.draining or self.drain_s <= 0 \
                or self._loop is None:
            super().handle_exit(sig, frame)
            return
        self.lifecycle.draining = True
        self._loop.call_soon_threadsafe(self._drain, sig)

    def _drain(self, sig: int) -> None:
        log.info("stopping: /ready answers 503; serving for %g s more, then in-flight requests "
                 "get %g s", self.drain_s, self.config.timeout_graceful_shutdown or 0)
        assert self._loop is not None
        self._loop.call_later(self.drain_s, super().handle_exit, sig, None)
