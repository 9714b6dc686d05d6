"""Pins of ``gateway/server/protocol.py`` and ``gateway/server/front_door.py``: they subclass
uvicorn's private httptools protocol (``uvicorn.protocols.http.httptools_impl.HttpToolsProtocol``),
replace its ``data_received`` and ``on_message_begin`` (and its ``on_response_complete`` for the
front door's exchanges), read its per-connection state and its ``RequestResponseCycle``'s, write
body pieces past the cycle's ``send``, and write the front door's responses with its status
lines; ``gateway/cli/main.py`` selects it with ``uvicorn.Config(http=<class>)``. These tests
fail, naming uvicorn's versions and the hook, when an upgrade changed those internals."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
from collections import deque
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from uvicorn.protocols.http import flow_control, httptools_impl
from uvicorn.server import ServerState

from gateway.server.protocol import RidgeHttpProtocol
from tests.unit.library_pins import Hook

WRITTEN_AGAINST = "0.54.0"
"""The uvicorn release RidgeHttpProtocol, BodyWriter and body_writer were written against."""

HOOK = Hook("uvicorn", WRITTEN_AGAINST,
            "RidgeHttpProtocol and body_writer in gateway/server/protocol.py, DirectExchange in "
            "gateway/server/front_door.py")

REPLACED = {"data_received": "77d64a8ed713", "on_message_begin": "edabbefc2c67",
            "on_response_complete": "04f458814d56"}
"""Fingerprints of uvicorn's own ``HttpToolsProtocol`` methods (:func:`fingerprint`) that
RidgeHttpProtocol replaces without calling them (``data_received``, ``on_message_begin`` with
:meth:`~gateway.server.protocol.RidgeHttpProtocol._asgi_scope`; ``on_response_complete`` with
``_direct_complete`` for a direct exchange), so a change in one must be carried over by
hand."""

# what RidgeHttpProtocol overrides and calls up to, with the parameters it passes
OVERRIDDEN: dict[str, list[str]] = {
    "connection_made": ["transport"], "data_received": ["data"],
    "on_message_begin": [], "on_header": ["name", "value"],
    "on_headers_complete": [], "on_body": ["body"], "on_message_complete": [],
    "connection_lost": ["exc"]}
CALLED: dict[str, list[str]] = {"_unset_keepalive_if_required": [], "_should_upgrade": [],
                                 "handle_websocket_upgrade": [],
                                 "_unsupported_upgrade_warning": [],
                                 "_start_asgi_task": ["cycle", "app"],
                                 "on_response_complete": [], "on_url": ["url"]}
# what it reads on the protocol (after connection_made) and on a request's cycle
PROTOCOL_STATE = ("loop", "parser", "scope", "cycle", "pipeline", "transport", "flow",
                  "server_state", "timeout_keep_alive", "asgi_version", "server", "client",
                  "scheme", "root_path", "app_state", "headers", "expect_100_continue")
CYCLE_STATE = ("scope", "transport", "flow", "disconnected", "response_started",
               "response_complete", "chunked_encoding")
# what RidgeHttpProtocol sets on itself: none may be uvicorn's own
OWN = ("limits", "_phase", "_deadline", "_timer", "_head_bytes", "_head_count", "_refusal",
       "_lingering", "_expect", "_on_timer", "_too_large", "_refuse", "doors", "_direct",
       "_door", "_asgi_scope", "_direct_complete")


def fingerprint(function: Any) -> str:
    """The first 12 hex digits of the SHA-256 of ``function``'s source, blank lines and
    indentation dropped."""
    lines = (line.strip() for line in inspect.getsource(function).splitlines())
    return hashlib.sha256("\n".join(line for line in lines if line).encode()).hexdigest()[:12]


class Transport(asyncio.Transport):
    """Keeps what is written; no socket, no peer."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def test_the_installed_uvicorn_is_the_minor_release_the_hook_was_checked_against() -> None:
    HOOK.check_version()
    HOOK.check_pin()


def test_the_private_protocol_class_and_its_methods_are_still_there() -> None:
    base = HOOK.attribute(httptools_impl, "HttpToolsProtocol")
    HOOK.check(issubclass(RidgeHttpProtocol, base), "RidgeHttpProtocol is not its subclass")
    HOOK.method(base, "__init__", ["config", "server_state", "app_state"])
    for name, params in {**OVERRIDDEN, **CALLED}.items():
        HOOK.method(base, name, params)
    HOOK.no_clash(base, OWN)
    for name, was in REPLACED.items():
        now = fingerprint(getattr(base, name))
        HOOK.check(now == was, f"HttpToolsProtocol.{name} changed (fingerprint {now}, was "
                   f"{was}): carry the change over to RidgeHttpProtocol, which replaces it")
    lines = HOOK.attribute(httptools_impl, "STATUS_LINE")
    HOOK.check(lines[200] == b"HTTP/1.1 200 OK\r\n" and lines[503].startswith(b"HTTP/1.1 503"),
               "STATUS_LINE no longer maps a status to its whole status line")


def test_the_cycle_and_flow_control_ridge_reads_and_writes_past() -> None:
    HOOK.attribute(httptools_impl, "RequestResponseCycle")
    flow = HOOK.attribute(flow_control, "FlowControl")(Transport())
    HOOK.instance_attributes(flow, ("write_paused",))
    HOOK.check(inspect.iscoroutinefunction(HOOK.method(flow, "drain")),
               "FlowControl.drain is no longer a coroutine")
    HOOK.method(flow, "resume_reading")


def test_the_config_still_takes_a_protocol_class() -> None:
    config = uvicorn.Config(app=None, http=RidgeHttpProtocol, log_config=None)  # type: ignore[arg-type]
    config.load()
    HOOK.check(getattr(config, "http_protocol_class", None) is RidgeHttpProtocol,
               "uvicorn.Config(http=<class>) no longer selects that protocol class")


@pytest.fixture
def uvicorn_logs_at_info() -> Iterator[None]:
    """uvicorn's error log at INFO for one test: at TRACE (which an earlier test's
    ``uvicorn.Config`` may leave set), uvicorn wraps ``send`` in its message logger, where
    body_writer finds no cycle and ridge relays the ordinary way."""
    logger = logging.getLogger("uvicorn.error")
    level = logger.level
    logger.setLevel(logging.INFO)
    yield
    logger.setLevel(level)


async def test_a_connection_has_the_state_ridge_reads_and_sends_through_its_cycle(
        uvicorn_logs_at_info: None) -> None:
    sends: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        sends.append(send)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    config = uvicorn.Config(app=app, log_config=None, lifespan="off")
    protocol = httptools_impl.HttpToolsProtocol(config, ServerState(), {},
                                                _loop=asyncio.get_running_loop())
    transport = Transport()
    protocol.connection_made(transport)
    HOOK.instance_attributes(protocol, PROTOCOL_STATE)
    HOOK.check(isinstance(protocol.pipeline, deque), "its pipeline is no longer a deque")
    HOOK.check(protocol.cycle is None, "a new connection has a request cycle")

    protocol.data_received(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n"
                           b"content-length: 0\r\n\r\n")
    HOOK.check("extensions" not in protocol.scope,
               "uvicorn now puts extensions in the scope; ridge's on_message_begin replaces them")
    cycle = protocol.cycle
    HOOK.check(isinstance(cycle, httptools_impl.RequestResponseCycle),
               "a request's cycle is no longer a RequestResponseCycle")
    HOOK.instance_attributes(cycle, CYCLE_STATE)
    for _ in range(100):
        if cycle.response_complete:
            break
        await asyncio.sleep(0.01)
    HOOK.check(sends and getattr(sends[0], "__self__", None) is cycle,
               "the ASGI send is no longer the request cycle's own bound send, which "
               "body_writer finds through send.__self__")
    HOOK.check(cycle.response_complete and transport.written.endswith(b"\r\n\r\nok"),
               "a response sent through the cycle did not complete it")
    protocol.connection_lost(None)


def test_a_failure_names_the_library_both_versions_and_the_hook() -> None:
    """The checks can fail: a class without the hook's method, as an upgrade could leave."""

    class Renamed:
        def on_header_received(self, name: bytes, value: bytes) -> None: ...

        def on_body(self, chunk: bytes) -> None: ...

    with pytest.raises(pytest.fail.Exception) as missing:
        HOOK.method(Renamed, "on_header", OVERRIDDEN["on_header"])
    with pytest.raises(pytest.fail.Exception) as renamed:
        HOOK.method(Renamed, "on_body", OVERRIDDEN["on_body"])
    message = str(missing.value)
    for part in (f"uvicorn {HOOK.installed()} is installed", f"uvicorn {WRITTEN_AGAINST}",
                 "Renamed has no attribute 'on_header'", "gateway/server/protocol.py"):
        assert part in message
    assert "takes ['chunk'] where ridge passes ['body']" in str(renamed.value)
    older = Hook("uvicorn", "0.53.0", "a hook checked against 0.53")  # as before an upgrade
    with pytest.raises(pytest.fail.Exception, match="written against uvicorn 0.53.0"):
        older.check_version()
    with pytest.raises(pytest.fail.Exception, match=r"uvicorn<0.55,>=0.54 excludes it"):
        older.check_pin()  # the pin admits only the minor the hooks were checked against
