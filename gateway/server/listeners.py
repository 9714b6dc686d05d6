"""The gateway's listening sockets, and a one-line reason when one cannot be opened.

- :func:`listening_socket`: a bound, listening, non-blocking TCP socket (raises ``OSError``);
- :func:`open_listener`: the same, but a failure is a :class:`ListenError` whose message names
  the address and the setting that chooses it (``--port``, ``RIDGE_ADMIN_PORT``, ``--host``);
- :func:`listener_near`: for ``ridge demo`` when the user chose no port: the port asked for if
  it is free, else one of the next :data:`NEAR_PORTS`, else any free port the kernel picks.
"""

from __future__ import annotations

import errno
import socket

NEAR_PORTS = 10
"""Ports after a taken one that :func:`listener_near` tries before asking the kernel."""

PORT_HINT = "pass --port with a free port (or set RIDGE_PORT)"
HOST_HINT = "pass --host with an address of this machine (or set RIDGE_HOST)"


class ListenError(Exception):
    """A listener that cannot be opened; the message names the address and what to change.
    ``in_use``: the port was taken (another server listens on it)."""

    def __init__(self, message: str, *, in_use: bool) -> None:
        super().__init__(message)
        self.in_use = in_use


def listening_socket(host: str, port: int) -> socket.socket:
    """A listening socket with TCP_NODELAY, which accepted connections inherit, so small SSE
    chunks leave at once instead of waiting on Nagle's algorithm."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except BaseException:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def open_listener(host: str, port: int, port_hint: str = PORT_HINT) -> socket.socket:
    """:func:`listening_socket`, or a :class:`ListenError` naming ``host:port`` and saying
    what to change (``port_hint`` when the port is the problem)."""
    try:
        return listening_socket(host, port)
    except OSError as exc:
        raise listen_error(host, port, exc, port_hint) from None


def listen_error(host: str, port: int, exc: OSError, port_hint: str = PORT_HINT) -> ListenError:
    """The one-line reason ``exc`` gives for not listening on ``host:port``."""
    where = f"cannot listen on {address(host, port)}"
    if exc.errno == errno.EADDRINUSE:
        return ListenError(f"{where}: the port is already in use; {port_hint}", in_use=True)
    if exc.errno == errno.EACCES:
        return ListenError(f"{where}: permission denied (ports below 1024 need privileges); "
                           f"{port_hint}", in_use=False)
    reason = exc.strerror or str(exc) or type(exc).__name__
    return ListenError(f"{where}: {reason}; {HOST_HINT}", in_use=False)


def listener_near(host: str, port: int) -> socket.socket:
    """A listener on ``port`` if it is free, else on the first free one of the next
    :data:`NEAR_PORTS` ports, else on a port the kernel picks. Raises :class:`ListenError`
    for anything but a taken port (an unknown host, say)."""
    candidates = range(port, min(port + NEAR_PORTS, 65535) + 1) if port else range(0)
    for candidate in candidates:
        try:
            return open_listener(host, candidate)
        except ListenError as exc:
            if not exc.in_use:
                raise
    return open_listener(host, 0)
