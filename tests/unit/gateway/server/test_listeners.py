from __future__ import annotations

import errno
import socket
from collections.abc import Iterator

import pytest

from gateway.server import listeners
from gateway.server.listeners import (
    ListenError,
    address,
    listen_error,
    listener_near,
    open_listener,
)


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_a_port_in_use_names_the_address_and_the_flag(taken_port: int) -> None:
    with pytest.raises(ListenError) as caught:
        open_listener("127.0.0.1", taken_port)
    assert caught.value.in_use
    assert str(caught.value) == (f"cannot listen on 127.0.0.1:{taken_port}: the port is already "
                                 "in use; pass --port with a free port (or set RIDGE_PORT)")


def test_the_hint_names_the_setting_that_chose_the_port(taken_port: int) -> None:
    with pytest.raises(ListenError, match="set RIDGE_ADMIN_PORT to a free port$"):
        open_listener("127.0.0.1", taken_port, "set RIDGE_ADMIN_PORT to a free port")


def test_an_unknown_host_points_at_the_host() -> None:
    with pytest.raises(ListenError) as caught:
        open_listener("no-such-host.invalid", 0)
    assert not caught.value.in_use
    assert str(caught.value).startswith("cannot listen on no-such-host.invalid:0: ")
    assert str(caught.value).endswith("pass --host with an address of this machine "
                                      "(or set RIDGE_HOST)")


def test_a_privileged_port_says_so() -> None:
    exc = listen_error("0.0.0.0", 80, PermissionError(errno.EACCES, "Permission denied"))
    assert "0.0.0.0:80: permission denied (ports below 1024 need privileges); pass --port" in (
        str(exc))


def test_ipv6_addresses_are_bracketed() -> None:
    assert address("::1", 8080) == "[::1]:8080"
    assert address("127.0.0.1", 8080) == "127.0.0.1:8080"


def test_listener_near_takes_the_port_asked_for_when_free() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    with listener_near("127.0.0.1", port) as sock:
        assert sock.getsockname()[1] == port


def test_listener_near_moves_past_a_taken_port(taken_port: int) -> None:
    with listener_near("127.0.0.1", taken_port) as sock:
        got = sock.getsockname()[1]
    assert got not in (taken_port, 0)


def test_listener_near_asks_the_kernel_when_no_near_port_is_free(
        taken_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listeners, "NEAR_PORTS", 0)  # only the taken port is "near"
    with listener_near("127.0.0.1", taken_port) as sock:
        assert sock.getsockname()[1] not in (taken_port, 0)


def test_listener_near_still_reports_a_bad_host() -> None:
    with pytest.raises(ListenError, match="--host"):
        listener_near("no-such-host.invalid", 8080)
