from __future__ import annotations

import socket

from backends.aiohttp_client import AiohttpResponse
from backends.client import nodelay_socket, relaying
from backends.http1_client import _Response


def test_upstream_sockets_have_nodelay() -> None:
    info = socket.getaddrinfo("127.0.0.1", 80, type=socket.SOCK_STREAM)[0]
    sock = nodelay_socket(info)
    try:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        sock.close()


def test_only_a_response_with_both_relay_methods_is_relaying() -> None:
    class Both:
        def relay(self, consumer: object) -> None: ...

        def stop_relay(self) -> None: ...

    class RelayOnly:
        def relay(self, consumer: object) -> None: ...

    class Attribute:
        relay = stop_relay = None

    both = Both()
    found: object = relaying(both)
    assert found is both
    assert relaying(RelayOnly()) is None and relaying(Attribute()) is None
    http1 = _Response.__new__(_Response)  # the class decides: no connection needed
    found = relaying(http1)
    assert found is http1
    assert relaying(AiohttpResponse.__new__(AiohttpResponse)) is None
