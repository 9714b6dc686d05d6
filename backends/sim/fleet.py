"""Start a whole simulated fleet from a fleet file: one HTTP server per endpoint, one process.

Every endpoint URL of every pool gets its own aiohttp server bound to 127.0.0.1 and the URL's port
(port 0 picks a free port; :attr:`RunningFleet.urls` then holds the real URLs), its own engine
loop, and a share of one :class:`~backends.sim.clock.ScaledClock` (``speed``) and one
:class:`~backends.sim.pd.KVTransferHub`. Runs are deterministic for a ``seed`` and an arrival
order (ids, generated text, speculative acceptance and stop lengths are seeded). A pool whose model
has a tokenizer under ``routing.features.tokenizers`` counts prompts with it
(:mod:`backends.sim.tokens`), loaded once for the fleet.

A pool with ``kv_events`` publishes each endpoint's KV-cache events as vLLM does
(:mod:`backends.sim.kv_events`, :mod:`backends.sim.kv_publisher`), bound on exactly the addresses
:meth:`~config.pools.Pool.kv_event_sources` gives (the endpoint URL's host with the
pool's ports, or its explicit ``addresses``), from start-up until :meth:`SimServer.stop`. The
events carry the model's token ids, so such a pool needs its model's tokenizer: without one
:func:`start_fleet` refuses the fleet (:class:`~config.fleet.FleetConfigError`) before
starting anything. An address already taken raises OSError naming the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from aiohttp import web

from backends.engines.tokenizers import fleet_tokenizers, pool_tokenizer
from backends.sim.clock import Clock, ScaledClock
from backends.sim.endpoint import SimEndpoint
from backends.sim.kv_publisher import ZmqPublisher
from backends.sim.pd import KVTransferHub
from backends.sim.wire import CLOSER, build_app, hard_close
from config.fleet import Fleet, FleetConfigError
from config.pools import Pool
from routing.tokens.exact import PromptTokenizer

HOST = "127.0.0.1"


@dataclass(eq=False)
class SimServer:
    """One endpoint's HTTP server. ``close``/``reopen`` stop and resume accepting connections."""

    endpoint: SimEndpoint
    configured_url: str
    port: int
    app_runner: web.AppRunner
    site: web.SockSite | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    async def open(self) -> None:
        """Listen on the port (0: a free one). The socket is bound here, not by the event loop,
        so a port taken meanwhile raises OSError(EADDRINUSE) whatever the loop (uvloop's
        server can come up without sockets instead)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((HOST, self.port))
            sock.listen(socket.SOMAXCONN)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        self.site = web.SockSite(self.app_runner, sock)
        await self.site.start()

    async def close(self) -> None:
        """Refuse new connections and reset the open ones (the engine keeps its state)."""
        if self.site is not None:
            await self.site.stop()
            self.site = None
        server = self.app_runner.server
        for conn in list(server.connections if server is not None else []):
            hard_close(conn.transport)

    async def reopen(self) -> None:
        if self.site is None:
            await self.open()

    def close_for(self, seconds: float) -> None:
        """Close now and reopen after ``seconds`` of wall-clock time (the admin API's ``close``)."""

        async def outage() -> None:
            await asyncio.sleep(0.05)  # let the admin answer go out first
            await self.close()
            await asyncio.sleep(seconds)
            await self.reopen()

        task = asyncio.create_task(outage())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await self.endpoint.runner.stop()
        if self.endpoint.kv_events is not None:
            self.endpoint.kv_events.close()
        await self.app_runner.cleanup()


@dataclass(eq=False)
class RunningFleet:
    """A started fleet: its servers (for chaos from Python), their URLs, and ``stop()``."""

    servers: list[SimServer]
    clock: Clock
    hub: KVTransferHub

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def server(self, url: str) -> SimServer:
        """The server for ``url`` (as configured or as bound)."""
        key = url.rstrip("/")
        for s in self.servers:
            if key in (s.url, s.configured_url):
                return s
        raise KeyError(url)

    async def stop(self) -> None:
        for s in self.servers:
            with contextlib.suppress(Exception):
                await s.stop()


async def start_fleet(fleet: Fleet, *, speed: float = 1.0, seed: int = 0,
                      clock: Clock | None = None) -> RunningFleet:
    """Start every endpoint of ``fleet``; ``speed`` compresses time, ``seed`` fixes randomness.
    ``clock``: the engines' clock instead of the wall clock scaled by ``speed`` (a
    :class:`~backends.sim.clock.LoopClock` on a virtual-time loop runs the fleet on virtual
    time)."""
    clock = clock or ScaledClock(speed)
    hub = KVTransferHub()
    running = RunningFleet([], clock, hub)
    tokenizers = fleet_tokenizers(fleet, report=False)  # the gateway's, for the same models
    for pool in fleet.pools:
        _check_kv_events(pool, pool_tokenizer(pool, tokenizers))
    try:
        for pool in fleet.pools:
            tokenizer = pool_tokenizer(pool, tokenizers)
            for index, url in enumerate(pool.endpoint_urls()):
                running.servers.append(
                    await _start_server(pool, index, url, clock, hub, seed, tokenizer)
                )
    except BaseException:
        await running.stop()
        raise
    return running


async def _start_server(
    pool: Pool,
    index: int,
    url: str,
    clock: Clock,
    hub: KVTransferHub,
    seed: int,
    tokenizer: PromptTokenizer | None = None,
) -> SimServer:
    port = urlsplit(url).port or 80
    endpoint = SimEndpoint(pool, index, port, clock, hub, seed, tokenizer)
    app = build_app(endpoint)
    app_runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    server = SimServer(endpoint, url, port, app_runner)
    app[CLOSER] = server.close_for
    await app_runner.setup()
    try:
        await server.open()
    except OSError as exc:
        await app_runner.cleanup()
        raise OSError(
            f"pool {pool.name!r}: cannot listen on {HOST}:{port} for {url}: {exc}"
        ) from exc
    endpoint.pd.link = replace(endpoint.pd.link, port=server.port)
    try:
        _publish_kv_events(pool, url, endpoint)
    except BaseException:
        await app_runner.cleanup()
        raise
    endpoint.runner.start()
    return server


def _check_kv_events(pool: Pool, tokenizer: PromptTokenizer | None) -> None:
    """Refuse ``kv_events`` on a pool whose model has no tokenizer (module docstring)."""
    if pool.kv_events is not None and tokenizer is None:
        raise FleetConfigError(
            f"pool {pool.name!r}: kv_events: the simulated engines report the token ids they "
            f"cache, which takes the model's tokenizer: name one for {pool.models[0]!r} under "
            "routing.features.tokenizers"
        )


def _publish_kv_events(pool: Pool, url: str, endpoint: SimEndpoint) -> None:
    """Start the endpoint's KV-cache event stream, if its pool has one."""
    source = pool.kv_event_sources([url]).get(url) if pool.kv_events is not None else None
    if source is None:
        return
    try:
        publisher = ZmqPublisher(source.publish, source.replay, source.topic)
    except OSError as exc:
        raise OSError(f"pool {pool.name!r}: cannot publish KV events for {url}: {exc}") from exc
    try:
        endpoint.publish_kv_events(publisher)
    except BaseException:
        publisher.close()
        raise
