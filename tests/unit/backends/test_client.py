from __future__ import annotations

import socket

from backends.client import nodelay_socket


def test_upstream_sockets_have_nodelay() -> None:
    info = socket.getaddrinfo("127.0.0.1", 80, type=socket.SOCK_STREAM)[0]
    sock = nodelay_socket(info)
    try:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        sock.close()
