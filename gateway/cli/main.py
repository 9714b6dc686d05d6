"""The ``ridge`` command.

- ``ridge serve --config FLEET.yaml [--host H] [--port P]``: the gateway in front of a fleet.
- ``ridge demo [--port P] [--speed X] [--real]``: the gateway in front of the simulated demo
  fleet (``gateway/demo/demo-fleet.yaml``, package data), all in one process; ``--real``: real
  vLLM engines. Engine ports already taken move to free ones (:mod:`gateway.cli.demo_ports`), and
  so does the gateway's port unless the user chose it (``--port`` or ``RIDGE_PORT``).
- ``ridge keys add|list|revoke``: API keys (:mod:`gateway.cli.keys`).
- ``ridge render compose|k8s FLEET [-o DIR]``: a deployment of a fleet file
  (:mod:`gateway.render.cli`).
- ``ridge plan --trace FILE --gpus N --accelerator NAME --model NAME``: the fleet that serves a
  recorded trace best (:mod:`gateway.cli.plan`).
- ``ridge NAME ...``: a command another installed distribution adds through the entry-point
  group ``ridge.commands`` (a function ``run(argv) -> exit status``), such as ``ridge bench``
  from ridge-bench (``bench/`` in the repository). ridge never imports them itself.
- ``ridge --version``: the installed distribution's version.

Settings also come from the environment (prefix ``RIDGE_``, see :mod:`gateway.settings`);
flags win over the environment. What an operator gets wrong (a setting, a flag, the fleet file,
a port in use) ends the command with status 2 and one line per problem, without a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import logging
import math
import os
import socket
import sys
import tempfile
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from importlib.metadata import EntryPoint, PackageNotFoundError, entry_points, version
from importlib.resources import as_file, files
from pathlib import Path
from typing import Any, cast

import uvicorn
import yaml
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backends.launch.real_fleet import RealFleetError, start_real_fleet
from config.fleet import Fleet, FleetConfigError, load_fleet
from gateway import native
from gateway.app import RidgeApp, create_app
from gateway.cli import keys as keys_cli
from gateway.cli import plan as plan_cli
from gateway.cli.demo_ports import free_engine_ports, start_sim_fleet, taken_endpoints
from gateway.cli.flags import positive
from gateway.cli.settings_errors import BadSettings, load_settings, unknown_variables
from gateway.render import cli as render_cli
from gateway.request.proxy import PROXIED_PATHS
from gateway.server.listeners import ListenError, address, listener_near, open_listener
from gateway.server.listeners import listening_socket as listening_socket
from gateway.server.protocol import HttpLimits, with_limits
from gateway.server.shutdown import DrainingServer, Lifecycle
from gateway.settings import Settings
from gateway.state.redis import RedisUnavailable, check_url
from gateway.state.shared_memory import WorkerContext
from gateway.telemetry.access_log import NotProxied
from gateway.workers.supervisor import serve_workers

DISTRIBUTION = "ridge"
DEMO_FLEET = "demo-fleet.yaml"
REAL_DEMO_FLEET = "demo-real-fleet.yaml"
COMMANDS_GROUP = "ridge.commands"
BUILTIN = ("serve", "demo", "keys", "render", "plan")
KNOWN_PLUGINS = {"bench": "ridge-bench (from a ridge checkout: pip install -e ./bench)"}
"""Plugin commands ridge can name when they are missing: command → how to install it."""
FLAG_SETTINGS = {"host": "--host", "port": "--port", "workers": "--workers"}
"""Settings the command line can set: field → flag."""
ADMIN_PORT_HINT = "set RIDGE_ADMIN_PORT to a free port"

DESCRIPTION = (
    "ridge: an OpenAI-compatible gateway in front of vLLM and SGLang engine fleets. It sends "
    "each request to the engine pool whose levers (speculative decoding, prefix caching, "
    "chunked prefill, prefill/decode disaggregation) suit its workload, picks the replica "
    "inside that pool, and reports TTFT, TPOT, goodput, MFU and MBU on /metrics.")
EPILOG = (
    "Settings also come from RIDGE_* environment variables, e.g. RIDGE_PORT=9000 or "
    "RIDGE_UPSTREAM__CONNECT_TIMEOUT_S=1 (docs/settings.md); flags win over them. "
    "`ridge COMMAND --help` shows a command's flags. A bad setting, flag or fleet file, or a "
    "port in use, ends a command with exit status 2 and one line saying what to change.")
SERVE_DESCRIPTION = (
    "Run the gateway in front of the engines of a fleet file until stopped: the OpenAI API "
    "under /v1, /health and /ready for probes, Prometheus metrics on /metrics. Ctrl-C stops "
    "it; SIGTERM first drains (/ready answers 503) for RIDGE_DRAIN_S.")
DEMO_DESCRIPTION = (
    f"Run the gateway in front of a simulated fleet (default {DEMO_FLEET}: five pools, each "
    "with a different lever), engines and gateway in one process, nothing else to install; "
    "it prints a curl command to try. Engine ports already in use are replaced by free ones; "
    "so is the gateway's port unless you chose it (--port or RIDGE_PORT).")


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
    args = _parse(_parser(plugins), argv)
    try:
        settings = _settings(args)
    except BadSettings as exc:
        return _fail(*exc.lines)
    for line in unknown_variables(os.environ):
        print(f"ridge: warning: {line}", file=sys.stderr)
    if args.command == "keys":
        return keys_cli.run(args, settings)
    if args.command == "render":
        return render_cli.run(args)
    if args.command == "plan":
        return plan_cli.run(args)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return _run_gateway(args, settings)
    except (FleetConfigError, RealFleetError, RedisUnavailable, ListenError) as exc:
        return _fail(problem(exc))
    except KeyboardInterrupt:
        return 0


def _run_gateway(args: argparse.Namespace, settings: Settings) -> int:
    """``ridge serve`` or ``ridge demo``; the exit status."""
    if old := native.stale():  # they would route with the code they were compiled from
        return _fail(native.stale_message(old))
    if args.command == "serve":
        path = args.config or settings.config
        if not path:
            return _fail("no fleet file: pass --config FILE or set RIDGE_CONFIG")
        fleet = load_fleet(path)
        settings = settings.model_copy(update={"config": path})  # what a reload reads again
        if settings.workers > 1:
            return serve_with_workers(settings, fleet)
        run(serve(settings, fleet))
    elif args.real:
        run(demo_real(settings, _demo_fleet(args.config, REAL_DEMO_FLEET)))
    else:
        fleet = _demo_fleet(args.config, DEMO_FLEET)
        run(demo(settings, fleet, speed=args.speed, seed=args.seed))
    return 0


def _fail(*lines: str) -> int:
    """Print each line on stderr, after ``ridge:``; exit status 2 (a usage error)."""
    for line in lines:
        print(f"ridge: {line}", file=sys.stderr)
    return 2


def problem(exc: Exception) -> str:
    """What to print for ``exc``: its message, a YAML syntax error's on one line."""
    cause = exc.__cause__
    if isinstance(exc, FleetConfigError) and isinstance(cause, yaml.YAMLError):
        head = str(exc).partition(" not valid YAML: ")[0]
        return f"{head} not valid YAML{_yaml_where(cause)}"
    return str(exc)


def _yaml_where(exc: yaml.YAMLError) -> str:
    """`` at line L, column C: problem (context)``, from a YAML parser's error."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return ": " + " ".join(str(exc).split())
    mark = exc.problem_mark
    context = f" ({exc.context})" if exc.context else ""
    return f" at line {mark.line + 1}, column {mark.column + 1}: {exc.problem}{context}"


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop when it is installed (more requests/s and less CPU per request
    than the default loop: docs/benchmarks/overhead.md), else on asyncio's own loop."""
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


def installed_version() -> str:
    """The installed distribution's version (package metadata), or ``unknown``."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


def _parser(plugins: Mapping[str, EntryPoint]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ridge", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {installed_version()}",
                        help="print ridge's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, title="commands",
                                metavar="COMMAND")
    for name, ep in sorted(plugins.items()):
        if name not in BUILTIN:
            sub.add_parser(name, help=_plugin_help(name, ep), add_help=False)
    _serve_parser(sub)
    _demo_parser(sub)
    keys_cli.add_parser(sub)
    render_cli.add_parser(sub)
    plan_cli.add_parser(sub)
    return parser


_TOP_FLAGS = ("-h", "--help", "--version")


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """``parser.parse_args``, but a flag the command does not know is reported by the command's
    own parser (its usage, ``ridge serve: error: ...``), not the top-level one; a flag before
    any command is named, not reported as a missing command."""
    if argv and argv[0].startswith("-") and argv[0].split("=")[0] not in _TOP_FLAGS:
        parser.error(f"unknown flag {argv[0]}: flags go after the command "
                     f"(ridge COMMAND --help lists them)")
    args, extra = parser.parse_known_args(argv)
    if extra:
        commands = _subcommands(parser)
        where = commands.get(getattr(args, "command", ""), parser)
        where.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _plugin_help(name: str, ep: EntryPoint) -> str:
    """The plugin distribution's summary (from its metadata: nothing is imported) and its name."""
    if ep.dist is None:
        return f"from {ep.value} (ridge {name} --help)"
    summary = (ep.dist.metadata.get_all("Summary") or [""])[0]
    return f"{summary} (from {ep.dist.name}; ridge {name} --help)".lstrip()


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve_p = sub.add_parser("serve", help="run the gateway in front of a fleet of engines",
                             description=SERVE_DESCRIPTION, epilog=EPILOG)
    serve_p.add_argument("--config", metavar="FLEET.yaml",
                         help="fleet file: the pools, their engines' URLs and levers "
                              "(or RIDGE_CONFIG; required)")
    serve_p.add_argument("--workers", type=int, metavar="N",
                         help="worker processes on the one port, routing as one gateway "
                              "(default 1; or RIDGE_WORKERS; one per core is the usual)")
    _listen_flags(serve_p, "")


def _demo_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo_p = sub.add_parser("demo", help="run the gateway with a simulated demo fleet, "
                            "all in one process", description=DEMO_DESCRIPTION, epilog=EPILOG)
    demo_p.add_argument("--config", metavar="FLEET.yaml",
                        help=f"fleet file to simulate (default: the packaged {DEMO_FLEET}; "
                             f"with --real, {REAL_DEMO_FLEET})")
    demo_p.add_argument("--speed", type=positive, default=1.0, metavar="X",
                        help="simulated time runs X times faster than real time (default 1)")
    demo_p.add_argument("--seed", type=int, default=0, metavar="N",
                        help="seed of every random draw of the simulator, for repeatable "
                             "runs (default 0)")
    demo_p.add_argument("--real", action="store_true",
                        help=f"real vLLM engines instead of simulated ones "
                             f"(default fleet {REAL_DEMO_FLEET}; needs `make engines`)")
    _listen_flags(demo_p, "; when you give none and 8080 is in use, a free port nearby")


def _listen_flags(parser: argparse.ArgumentParser, port_note: str) -> None:
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1; or "
                        "RIDGE_HOST; 0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, help=f"port to listen on (default 8080; or "
                        f"RIDGE_PORT{port_note})")


def _settings(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Settings:
    """The environment's settings with the flags given on top, or :class:`BadSettings` (one
    line per bad value)."""
    flags = {k: v for k in FLAG_SETTINGS if (v := getattr(args, k, None)) is not None}
    return load_settings(flags, FLAG_SETTINGS, os.environ if environ is None else environ)


def uvicorn_config(app: RidgeApp, settings: Settings) -> uvicorn.Config:
    """The server's settings: logging, idle keep-alive and graceful shutdown [s], ridge's
    protocol with the connection limits of ``settings.http``; a failing start-up (lifespan)
    stops the server."""
    protocol = with_limits(HttpLimits(**settings.http.model_dump()), app.door)
    config = uvicorn.Config(
        app, log_level=settings.log_level, access_log=settings.access_log, lifespan="on",
        timeout_keep_alive=max(1, math.ceil(settings.keep_alive_s)),
        timeout_graceful_shutdown=max(1, math.ceil(settings.shutdown_timeout_s)), http=protocol,
        proxy_headers=False,
    )
    if settings.access_log:  # the engine routes' lines are ridge's own (gateway.telemetry)
        uvicorn_access = logging.getLogger("uvicorn.access")
        if not any(isinstance(f, NotProxied) for f in uvicorn_access.filters):
            uvicorn_access.addFilter(NotProxied(PROXIED_PATHS))
    return config


GC_THRESHOLDS = (20_000, 50, 100)
"""Allocations between two young-generation collections, and the older generations' ratios.
Python's default (700, 10, 10) collects every few requests and stalls the loop for the full
heap every few hundred; these collect far less often, which the overhead benchmark shows as
less CPU per request and fewer p99 latency spikes (docs/benchmarks/overhead.md)."""


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
    first (:mod:`gateway.server.shutdown`). Raises :class:`RedisUnavailable` when the app's start-up
    refused to start without Redis (:class:`StartupRefusals`), :class:`ListenError` when a
    socket cannot be opened."""
    opened = sock is None
    if sock is None:  # first, so that a port in use stops the start-up before any work
        sock = open_listener(settings.host, settings.port)
        admin = admin_socket(settings)
    lifecycle = Lifecycle()
    app = create_app(settings, fleet, worker=worker, lifecycle=lifecycle)
    refused: list[RedisUnavailable] = []
    app.api.add_middleware(StartupRefusals, refused=refused)
    config = uvicorn_config(app, settings)
    tune_gc()
    if opened:
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
    """``ridge serve --workers N`` (:mod:`gateway.workers.supervisor`); the exit status. With
    ``state.redis_required``, Redis is checked here first (:func:`require_redis`): a worker
    that cannot start would only be restarted until the supervisor gives up."""
    if settings.state.redis_required and settings.redis_url is not None:
        run(require_redis(settings.redis_url, settings.state.redis_timeout_s))
    sock = open_listener(settings.host, settings.port)
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
    """The admin listener's socket (``settings.admin_port`` on the same host), or None;
    :class:`ListenError` when it cannot be opened."""
    if settings.admin_port is None:
        return None
    sock = open_listener(settings.host, settings.admin_port, ADMIN_PORT_HINT)
    logging.getLogger("ridge").info("admin routes (/metrics, /docs) on http://%s only",
                                    address(settings.host, settings.admin_port))
    return sock


def _announce(sock: socket.socket, workers: int = 1) -> None:
    host, port = sock.getsockname()[:2]
    processes = f" ({workers} workers)" if workers > 1 else ""
    log = logging.getLogger("ridge")
    log.info("ridge listening on http://%s%s", address(host, port), processes)
    log.info("modules compiled to C: %s", ", ".join(native.compiled()) or "none")


def demo_listeners(settings: Settings) -> tuple[socket.socket, socket.socket | None, Settings]:
    """The demo gateway's sockets, opened before anything is started or announced, and the
    settings with the port it got. A port the user chose (``--port`` or ``RIDGE_PORT``) is
    used or refused (:class:`ListenError`); the default one, when taken, gives way to a free
    port nearby, which is said on stdout."""
    if "port" in settings.model_fields_set:
        sock = open_listener(settings.host, settings.port)
    else:
        sock = listener_near(settings.host, settings.port)
    port = int(sock.getsockname()[1])
    if settings.port and port != settings.port:
        print(f"ridge demo: {address(settings.host, settings.port)} is in use; the gateway "
              f"listens on port {port} instead (--port chooses one)", flush=True)
    try:
        admin = admin_socket(settings)
    except ListenError:
        sock.close()
        raise
    return sock, admin, settings.model_copy(update={"port": port})


async def demo(settings: Settings, fleet: Fleet, *, speed: float, seed: int) -> None:
    """Start the simulated fleet (its taken ports moved to free ones), then the gateway in
    front of it; stop both on exit."""
    from backends.sim.fleet import start_fleet

    sock, admin, settings = demo_listeners(settings)
    with _closing(sock, admin):
        start = functools.partial(start_fleet, speed=speed, seed=seed)
        try:
            running, fleet, moved = await start_sim_fleet(fleet, start)
        except FleetConfigError:
            raise
        except ValueError as exc:  # the simulator refuses a pool (backends.sim.configure)
            raise FleetConfigError(f"cannot simulate this fleet: {exc}") from exc
        try:
            _say_moved(moved, "simulated")
            _print_demo_banner(settings, fleet)
            _announce(sock)
            await serve(settings, fleet, sock, admin=admin)
        finally:
            await running.stop()


async def demo_real(settings: Settings, fleet: Fleet) -> None:
    """Start real vLLM engines for the fleet (its taken ports moved to free ones), then the
    gateway in front of them."""
    sock, admin, settings = demo_listeners(settings)
    with _closing(sock, admin):
        moved = taken_endpoints(fleet)
        fleet = free_engine_ports(fleet, moved)
        _say_moved(moved, "vLLM")
        logs = Path(tempfile.mkdtemp(prefix="ridge-engines-"))
        print(f"ridge demo --real: starting {sum(len(p.endpoints) for p in fleet.pools)} vLLM "
              f"engine(s), about a minute (logs in {logs})", flush=True)
        running = await start_real_fleet(fleet, logs)
        try:
            _print_demo_banner(settings, fleet, "real vLLM")
            _announce(sock)
            await serve(settings, fleet, sock, admin=admin)
        finally:
            await running.stop()


@contextlib.contextmanager
def _closing(*socks: socket.socket | None) -> Iterator[None]:
    """Close ``socks`` on the way out (the server may have closed them already)."""
    try:
        yield
    finally:
        for sock in socks:
            if sock is not None:
                sock.close()


def _say_moved(moved: Sequence[str], kind: str) -> None:
    if moved:
        ports = ", ".join(url.rsplit(":", 1)[-1] for url in moved)
        print(f"ridge demo: port(s) {ports} of the fleet file in use; those {kind} engines "
              "listen on free ports instead", flush=True)


def _print_demo_banner(settings: Settings, fleet: Fleet, kind: str = "simulated") -> None:
    base = f"http://{address(settings.host, settings.port)}"
    model = fleet.pools[0].models[0]
    print(f"ridge demo: {len(fleet.pools)} {kind} pools behind {base}", flush=True)
    for pool in fleet.pools:
        ports = ",".join(url.rsplit(":", 1)[-1] for url in pool.endpoint_urls())
        print(
            f"  pool {pool.name:<12} {pool.engine.value:<7} {pool.role.value:<8} "
            f"{len(pool.endpoints)} endpoint(s), port(s) {ports}",
            flush=True,
        )
    print(
        f"try: curl {base}/v1/chat/completions -H 'content-type: application/json' "
        f'-d \'{{"model": "{model}", "messages": [{{"role": "user", '
        f'"content": "Hello"}}]}}\'',
        flush=True,
    )
    where = f"http://{address(settings.host, settings.admin_port)}" \
        if settings.admin_port is not None else base
    print(f"watch: {where}/dashboard (the live page of the fleet)", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
