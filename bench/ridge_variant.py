"""Run ridge as the transport benchmark needs it, without changing ridge's code.

``python -m bench.ridge_variant --config FLEET.yaml --port P [--transport T] [--loop L]
[--nodelay-off none|down|up|both] [--probe]``

It serves exactly what ``ridge serve`` serves (``gateway.app.create_app`` behind uvicorn on a
socket from ``gateway.cli.listening_socket``), with four benchmark-only switches:

- ``--transport``: ``aiohttp`` or ``httpx`` (ridge's own), or ``httpx-aiohttp``
  (:mod:`bench.httpx_aiohttp_client`, not part of ridge);
- ``--loop``: ``asyncio`` (what ``ridge serve`` runs on: ``asyncio.run``) or ``uvloop``;
- ``--nodelay-off``: ``ridge-code`` removes ridge's own two TCP_NODELAY calls (the listening
  socket is built without it, ``backends.aiohttp_client.nodelay_socket`` is replaced by a
  plain socket factory) and leaves everything else alone: this shows what those calls are
  worth. ``down``, ``up`` and ``both`` remove them too and then really turn TCP_NODELAY OFF
  on ridge's downstream sockets (accepted from clients), upstream sockets (to engines), or
  both. That takes more, because two later layers switch it back ON for every TCP
  connection: asyncio's ``_SelectorSocketTransport.__init__``
  (``asyncio.base_events._set_nodelay``) and aiohttp's ``BaseProtocol.connection_made``
  (``aiohttp.base_protocol.tcp_nodelay``). Both are replaced by one policy that sets the
  wanted value per side, so the final state is the policy's. uvloop sets TCP_NODELAY inside
  its compiled ``TCPTransport.new`` and cannot be patched, so ``--nodelay-off`` requires
  ``--loop asyncio``.
- ``--probe``: log, on the first write of every connection, the TCP_NODELAY value actually in
  force (``bench-nodelay role=down|up nodelay=0|1`` on stderr), so the benchmark can show
  what it compared instead of assuming it. asyncio loop only.

A socket is "down" when its local port is ridge's listening port, else "up".
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp.base_protocol
import uvicorn

import backends.aiohttp_client
from backends.client import BackendClient, Timeouts
from backends.config import load_fleet
from gateway.app import create_app, default_client
from gateway.cli import listening_socket
from gateway.settings import Settings, UpstreamSettings

ClientFactory = Callable[[UpstreamSettings], BackendClient]
OFF_SIDES = {"none": (False, False), "ridge-code": (False, False), "down": (True, False),
             "up": (False, True), "both": (True, True)}


def _is_tcp(sock: socket.socket) -> bool:
    return sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM


def _role(sock: socket.socket, listen_port: int) -> str:
    return "down" if sock.getsockname()[1] == listen_port else "up"


def plain_socket(addr_info: tuple[object, ...]) -> socket.socket:
    """As ``backends.client.nodelay_socket`` but without setting TCP_NODELAY."""
    family, kind, proto = addr_info[0], addr_info[1], addr_info[2]
    assert isinstance(family, int) and isinstance(kind, int) and isinstance(proto, int)
    return socket.socket(family, kind, proto)


def remove_ridge_nodelay() -> None:
    """ridge's aiohttp transport creates its upstream sockets without TCP_NODELAY."""
    # a name the module imports rather than exports: mypy wants setattr here
    setattr(backends.aiohttp_client, "nodelay_socket", plain_socket)  # noqa: B010


def install_nodelay_policy(listen_port: int, down_off: bool, up_off: bool) -> None:
    """Make every TCP connection of this process end up with the wanted TCP_NODELAY."""

    def apply(sock: socket.socket) -> None:
        if _is_tcp(sock):
            off = down_off if _role(sock, listen_port) == "down" else up_off
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0 if off else 1)

    def tcp_nodelay(transport: asyncio.Transport, value: bool) -> None:
        sock = transport.get_extra_info("socket")
        if isinstance(sock, socket.socket):
            apply(sock)

    # names their modules do not export (mypy): setattr
    setattr(asyncio.base_events, "_set_nodelay", apply)  # noqa: B010
    setattr(aiohttp.base_protocol, "tcp_nodelay", tcp_nodelay)  # noqa: B010


def install_nodelay_probe(listen_port: int) -> None:
    """Log the TCP_NODELAY value in force at the first write of every selector transport."""
    cls: Any = getattr(asyncio.selector_events, "_SelectorSocketTransport")  # noqa: B009
    original = cls.write
    seen: weakref.WeakSet[object] = weakref.WeakSet()

    def write(self: Any, data: Any) -> None:
        if self not in seen:
            seen.add(self)
            sock = self.get_extra_info("socket")
            value = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            print(f"bench-nodelay role={_role(sock, listen_port)} nodelay={int(bool(value))}",
                  file=sys.stderr, flush=True)
        original(self, data)

    cls.write = write


def plain_listening_socket(host: str, port: int) -> socket.socket:
    """As ``gateway.cli.listening_socket`` but with TCP_NODELAY left OFF."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def client_factory(transport: str) -> ClientFactory:
    """ridge's own transports through ridge's factory; httpx-aiohttp from the bench."""
    if transport != "httpx-aiohttp":
        return default_client
    from bench.httpx_aiohttp_client import HttpxAiohttpClient

    def factory(upstream: UpstreamSettings) -> BackendClient:
        timeouts = Timeouts(upstream.connect_timeout_s, upstream.first_byte_timeout_s,
                            upstream.stream_idle_timeout_s)
        return HttpxAiohttpClient(timeouts, upstream.max_connections)

    return factory


async def serve(settings: Settings, config: str, factory: ClientFactory,
                plain_listener: bool) -> None:
    """``gateway.cli.serve`` with an injected client factory; ``plain_listener``: the
    listening socket without ridge's TCP_NODELAY."""
    app = create_app(settings, load_fleet(config), client_factory=factory)
    uv_config = uvicorn.Config(app, log_level=settings.log_level, timeout_graceful_shutdown=10)
    make_socket = plain_listening_socket if plain_listener else listening_socket
    await uvicorn.Server(uv_config).serve(sockets=[make_socket(settings.host, settings.port)])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.ridge_variant", description=__doc__)
    parser.add_argument("--config", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--transport", choices=("aiohttp", "httpx", "httpx-aiohttp"),
                        default="aiohttp")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--nodelay-off", choices=tuple(OFF_SIDES), default="none")
    parser.add_argument("--probe", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.loop == "uvloop" and (args.nodelay_off != "none" or args.probe):
        print("--nodelay-off and --probe need --loop asyncio", file=sys.stderr)
        return 2
    down_off, up_off = OFF_SIDES[args.nodelay_off]
    ridge_code_off = args.nodelay_off != "none"
    if ridge_code_off:
        remove_ridge_nodelay()
    if down_off or up_off:
        install_nodelay_policy(args.port, down_off, up_off)
    if args.probe:
        install_nodelay_probe(args.port)
    ridge_transport = "httpx" if args.transport == "httpx-aiohttp" else args.transport
    settings = Settings(port=args.port, upstream=UpstreamSettings(transport=ridge_transport))
    work = serve(settings, args.config, client_factory(args.transport), ridge_code_off)
    try:
        if args.loop == "uvloop":
            import uvloop
            uvloop.run(work)
        else:
            asyncio.run(work)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
