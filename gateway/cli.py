"""The ``ridge`` command.

- ``ridge serve --config FLEET.yaml [--host H] [--port P]``: the gateway in front of a fleet.
- ``ridge demo [--port P] [--speed X] [--real]``: the gateway in front of the simulated demo
  fleet (``gateway/demo/demo-fleet.yaml``, package data), all in one process; ``--real``: real
  vLLM engines.
- ``ridge keys add|list|revoke``: API keys (:mod:`gateway.keys_cli`).
- ``ridge render compose|k8s FLEET [-o DIR]``: a deployment of a fleet file
  (:mod:`gateway.render.cli`).
- ``ridge NAME ...``: a command another installed distribution adds through the entry-point
  group ``ridge.commands`` (a function ``run(argv) -> exit status``), such as ``ridge bench``
  from ridge-bench (``bench/`` in the repository). ridge never imports them itself.

Settings also come from the environment (prefix ``RIDGE_``, see :mod:`gateway.settings`);
flags win over the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import math
import socket
import sys
import tempfile
from collections.abc import Callable, Coroutine, Mapping, Sequence
from importlib.metadata import EntryPoint, entry_points
from importlib.resources import as_file, files
from pathlib import Path
from typing import Any, cast

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backends.fleet_file import Fleet, FleetConfigError, load_fleet
from backends.real_fleet import RealFleetError, start_real_fleet
from gateway import keys_cli
from gateway.app import RidgeApp, create_app
from gateway.http_protocol import HttpLimits, with_limits
from gateway.redis_state import RedisUnavailable, check_url
from gateway.render import cli as render_cli
from gateway.settings import Settings
from gateway.shutdown import DrainingServer, Lifecycle
from gateway.worker_state import WorkerContext
from gateway.workers import serve_workers

DEMO_FLEET = "demo-fleet.yaml"
REAL_DEMO_FLEET = "demo-real-fleet.yaml"
COMMANDS_GROUP = "ridge.commands"
BUILTIN = ("serve", "demo", "keys", "render")
KNOWN_PLUGINS = {"bench": "ridge-bench (from a ridge checkout: pip install -e ./bench)"}
"""Plugin commands ridge can name when they are missing: command → how to install it."""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    plugins = plugin_commands()
    name = argv[0] if argv else ""
    if name in plugins and name not in BUILTIN:
        command = cast(Callable[[list[str]], int], plugins[name].load())
        return command(argv[1:])
    if name in KNOWN_PLUGINS:
        print(f"ridge {name}: not installed; install {KNOWN_PLUGINS[name]}", file=sys.stderr)
        return 2
    args = _parser(plugins).parse_args(argv)
    settings = _settings(args)
    if args.command == "keys":
        return keys_cli.run(args, settings)
    if args.command == "render":
        return render_cli.run(args)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        if args.command == "serve":
            path = args.config or settings.config
            if not path:
                print(
                    "ridge: no fleet file: pass --config FILE or set RIDGE_CONFIG", file=sys.stderr
                )
                return 2
            fleet = load_fleet(path)
            if settings.workers > 1:
                return serve_with_workers(settings, fleet)
            run(serve(settings, fleet))
        elif args.real:
            fleet = _demo_fleet(args.config, REAL_DEMO_FLEET)
            run(demo_real(settings, fleet))
        else:
            fleet = _demo_fleet(args.config, DEMO_FLEET)
            run(demo(settings, fleet, speed=args.speed, seed=args.seed))
    except (FleetConfigError, RealFleetError, RedisUnavailable) as exc:
        print(f"ridge: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop when it is installed (measured 2–15 % more requests/s and less
    CPU per request than the default loop), else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


def plugin_commands() -> Mapping[str, EntryPoint]:
    """The commands installed distributions add (entry-point group ``ridge.commands``)."""
    return {ep.name: ep for ep in entry_points(group=COMMANDS_GROUP)}


def _demo_fleet(config: str | None, name: str) -> Fleet:
    """``config`` if given, else the demo fleet ``name`` shipped inside the package."""
    if config:
        return load_fleet(config)
    with as_file(files("gateway").joinpath("demo", name)) as path:
        return load_fleet(path)


def _parser(plugins: Mapping[str, EntryPoint]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ridge", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, ep in sorted(plugins.items()):
        if name not in BUILTIN:
            dist = ep.dist.name if ep.dist else ep.value
            sub.add_parser(name, help=f"from {dist} (ridge {name} --help)", add_help=False)
    serve_p = sub.add_parser("serve", help="run the gateway in front of a fleet")
    serve_p.add_argument("--config", help="fleet YAML file (or RIDGE_CONFIG)")
    serve_p.add_argument("--workers", type=int,
                         help="worker processes on the one port, routing as one gateway "
                              "(default 1; or RIDGE_WORKERS; one per core is the usual)")
    demo_p = sub.add_parser("demo", help="run the gateway with the simulated demo fleet")
    demo_p.add_argument("--config", help=f"fleet file to simulate (default {DEMO_FLEET})")
    demo_p.add_argument("--speed", type=float, default=1.0, help="simulated time speed-up")
    demo_p.add_argument("--seed", type=int, default=0)
    demo_p.add_argument("--real", action="store_true",
                        help=f"real vLLM engines instead of simulated ones "
                             f"(default fleet {REAL_DEMO_FLEET}; needs `make engines`)")
    keys_cli.add_parser(sub)
    render_cli.add_parser(sub)
    for p in (serve_p, demo_p):
        p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
        p.add_argument("--port", type=int, help="port to listen on (default 8080)")
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {k: v for k in ("host", "port", "workers")
                 if (v := getattr(args, k, None)) is not None}
    return Settings(**overrides)


def listening_socket(host: str, port: int) -> socket.socket:
    """A listening socket with TCP_NODELAY, which accepted connections inherit, so small SSE
    chunks leave at once instead of waiting on Nagle's algorithm."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def uvicorn_config(app: RidgeApp, settings: Settings) -> uvicorn.Config:
    """The server's settings: logging, idle keep-alive and graceful shutdown [s], ridge's
    protocol with the connection limits of ``settings.http``; a failing start-up (lifespan)
    stops the server."""
    protocol = with_limits(HttpLimits(**settings.http.model_dump()))
    return uvicorn.Config(
        app, log_level=settings.log_level, access_log=settings.access_log, lifespan="on",
        timeout_keep_alive=max(1, math.ceil(settings.keep_alive_s)),
        timeout_graceful_shutdown=max(1, math.ceil(settings.shutdown_timeout_s)), http=protocol,
        proxy_headers=False,
    )


GC_THRESHOLDS = (20_000, 50, 100)
"""Allocations between two young-generation collections, and the older generations' ratios.
Python's default (700, 10, 10) collects every few requests and stalls the loop for the full
heap every few hundred: measured with the overhead benchmark, these cut ~10 % of the CPU per
request and most of the p99 latency spikes."""


def tune_gc() -> None:
    """Collect less often, and move everything built at start-up out of the collector's way
    (:func:`gc.freeze`): a serving process allocates many short-lived objects and few cycles."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def serve(settings: Settings, fleet: Fleet, sock: socket.socket | None = None,
                worker: WorkerContext | None = None, admin: socket.socket | None = None) -> None:
    """Serve the gateway until stopped (on ``sock`` and ``admin`` when given: a worker's;
    else on new sockets, the admin one when ``settings.admin_port`` is set); SIGTERM drains
    first (:mod:`gateway.shutdown`). Raises :class:`RedisUnavailable` when the app's start-up
    refused to start without Redis (:class:`StartupRefusals`)."""
    lifecycle = Lifecycle()
    app = create_app(settings, fleet, worker=worker, lifecycle=lifecycle)
    refused: list[RedisUnavailable] = []
    app.api.add_middleware(StartupRefusals, refused=refused)
    config = uvicorn_config(app, settings)
    tune_gc()
    if sock is None:
        sock = listening_socket(settings.host, settings.port)
        admin = admin_socket(settings)
        _announce(sock)
    sockets = [sock] if admin is None else [sock, admin]
    try:
        await DrainingServer(config, lifecycle, settings.drain_s).serve(sockets=sockets)
    except SystemExit:  # uvicorn's exit on a failed start-up
        if refused:
            raise refused[0] from None
        raise


class StartupRefusals:
    """ASGI middleware of the FastAPI application (off the generation path). A lifespan
    start-up that raises :class:`RedisUnavailable` is reported to uvicorn as failed without
    the traceback Starlette attaches to the report (uvicorn logs one line and exits), and the
    exception is put in ``refused``, for :func:`serve` to raise in place of uvicorn's exit.
    Any other failure is passed on unchanged."""

    def __init__(self, app: ASGIApp, refused: list[RedisUnavailable]) -> None:
        self.app = app
        self.refused = refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        held: list[Message] = []

        async def hold_failure(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed":
                held.append(message)
            else:
                await send(message)

        try:
            await self.app(scope, receive, hold_failure)
        except RedisUnavailable as exc:
            self.refused.append(exc)
            held[:] = [{"type": "lifespan.startup.failed", "message": ""}]
        finally:
            for message in held:
                await send(message)


def serve_with_workers(settings: Settings, fleet: Fleet) -> int:
    """``ridge serve --workers N`` (:mod:`gateway.workers`); the exit status. With
    ``state.redis_required``, Redis is checked here first (:func:`require_redis`): a worker
    that cannot start would only be restarted until the supervisor gives up."""
    if settings.state.redis_required and settings.redis_url is not None:
        run(require_redis(settings.redis_url, settings.state.redis_timeout_s))
    sock = listening_socket(settings.host, settings.port)
    admin = admin_socket(settings)
    _announce(sock, settings.workers)

    def worker_main(context: WorkerContext, inherited: socket.socket) -> int:
        try:
            run(serve(settings, fleet, inherited, context, admin))
        except RedisUnavailable as exc:
            print(f"ridge: worker {context.index}: {exc}", file=sys.stderr)
            return 2
        return 0

    return serve_workers(fleet, settings.workers, sock, worker_main)


async def require_redis(url: str, timeout_s: float) -> None:
    """Raise :class:`RedisUnavailable` unless the Redis at ``url`` passes the start-up check."""
    check = await check_url(url, timeout_s)
    if not check.ok:
        raise check.refusal()


def admin_socket(settings: Settings) -> socket.socket | None:
    """The admin listener's socket (``settings.admin_port`` on the same host), or None."""
    if settings.admin_port is None:
        return None
    sock = listening_socket(settings.host, settings.admin_port)
    logging.getLogger("ridge").info("admin routes (/metrics, /docs) on http://%s:%s only",
                                    settings.host, settings.admin_port)
    return sock


def _announce(sock: socket.socket, workers: int = 1) -> None:
    host, port = sock.getsockname()[:2]
    processes = f" ({workers} workers)" if workers > 1 else ""
    logging.getLogger("ridge").info("ridge listening on http://%s:%s%s", host, port, processes)


async def demo(settings: Settings, fleet: Fleet, *, speed: float, seed: int) -> None:
    """Start the simulated fleet, then the gateway in front of it; stop both on exit."""
    from backends.sim.fleet import start_fleet

    running = await start_fleet(fleet, speed=speed, seed=seed)
    try:
        _print_demo_banner(settings, fleet)
        await serve(settings, fleet)
    finally:
        await running.stop()


async def demo_real(settings: Settings, fleet: Fleet) -> None:
    """Start real vLLM engines for the fleet, then the gateway in front of them."""
    logs = Path(tempfile.mkdtemp(prefix="ridge-engines-"))
    print(f"ridge demo --real: starting {sum(len(p.endpoints) for p in fleet.pools)} vLLM "
          f"engine(s), about a minute (logs in {logs})", flush=True)
    running = await start_real_fleet(fleet, logs)
    try:
        _print_demo_banner(settings, fleet, "real vLLM")
        await serve(settings, fleet)
    finally:
        await running.stop()


def _print_demo_banner(settings: Settings, fleet: Fleet, kind: str = "simulated") -> None:
    base = f"http://{settings.host}:{settings.port}"
    model = fleet.pools[0].models[0]
    print(f"ridge demo: {len(fleet.pools)} {kind} pools behind {base}", flush=True)
    for pool in fleet.pools:
        print(
            f"  pool {pool.name:<12} {pool.engine.value:<7} {pool.role.value:<8} "
            f"{len(pool.endpoints)} endpoint(s)",
            flush=True,
        )
    print(
        f"try: curl {base}/v1/chat/completions -H 'content-type: application/json' "
        f'-d \'{{"model": "{model}", "messages": [{{"role": "user", '
        f'"content": "Hello"}}]}}\'',
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
