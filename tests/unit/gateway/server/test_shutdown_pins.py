"""Pins of ``gateway/server/shutdown.py``: ``DrainingServer`` extends ``uvicorn.Server`` past
its documented use (``Server(config).serve()``): it overrides the undocumented signal handler
``handle_exit(sig, frame)`` and calls up to it later, passes ``serve(sockets=...)``, reads
``config.timeout_graceful_shutdown`` and keeps attributes of its own on the server. These tests
fail, naming uvicorn's versions and the hook, when an upgrade changed those internals."""

from __future__ import annotations

import signal
import threading

import pytest
import uvicorn

from gateway.server.shutdown import DrainingServer, Lifecycle
from tests.unit.library_pins import Hook

WRITTEN_AGAINST = "0.54.0"
"""The uvicorn release DrainingServer was written against."""

HOOK = Hook("uvicorn", WRITTEN_AGAINST,
            "DrainingServer.handle_exit / serve / _drain in gateway/server/shutdown.py")

OWN = ("lifecycle", "drain_s", "_loop", "_drain")
"""What DrainingServer sets on itself: none may be uvicorn.Server's own."""


def config() -> uvicorn.Config:
    return uvicorn.Config(app=None, log_config=None, timeout_graceful_shutdown=5)  # type: ignore[arg-type]


def test_the_installed_uvicorn_is_the_minor_release_the_hook_was_checked_against() -> None:
    HOOK.check_version()
    HOOK.check_pin()


def test_the_server_methods_ridge_overrides_and_calls() -> None:
    server = HOOK.attribute(uvicorn, "Server")
    HOOK.check(issubclass(DrainingServer, server), "DrainingServer is not its subclass")
    HOOK.method(server, "__init__", ["config"])
    HOOK.method(server, "serve", ["sockets"])
    HOOK.method(server, "handle_exit", ["sig", "frame"])
    HOOK.method(server, "capture_signals")
    made = server(config())
    HOOK.no_clash(server, OWN)
    HOOK.check(not any(name in vars(made) for name in OWN),
               f"a uvicorn.Server now sets one of {OWN}, which DrainingServer uses for its own")
    HOOK.instance_attributes(made, ("config", "should_exit"))
    HOOK.check(made.config.timeout_graceful_shutdown == 5,
               "Config.timeout_graceful_shutdown, which the drain log reads, is gone")


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signal handlers are set only in the main thread")
def test_signals_reach_the_overridden_handler() -> None:
    made = DrainingServer(config(), Lifecycle(), 1.0)
    before = signal.getsignal(signal.SIGTERM)
    with made.capture_signals():
        HOOK.check(signal.getsignal(signal.SIGTERM) == made.handle_exit,
                   "Server.capture_signals no longer installs self.handle_exit for SIGTERM, "
                   "so DrainingServer's drain would never run")
    assert signal.getsignal(signal.SIGTERM) == before
    made.handle_exit(signal.SIGINT, None)  # not a drain: uvicorn's own, which asks to exit
    HOOK.check(made.should_exit, "Server.handle_exit no longer sets should_exit")


def test_a_failure_names_the_library_both_versions_and_the_hook() -> None:
    """The checks can fail: a server whose handler lost its frame parameter, as an upgrade
    could leave it."""

    class Changed:
        def handle_exit(self, sig: int) -> None: ...

    with pytest.raises(pytest.fail.Exception) as failed:
        HOOK.method(Changed, "handle_exit", ["sig", "frame"])
    message = str(failed.value)
    for part in (f"uvicorn {HOOK.installed()} is installed", f"uvicorn {WRITTEN_AGAINST}",
                 "takes ['sig'] where ridge passes ['sig', 'frame']",
                 "gateway/server/shutdown.py"):
        assert part in message

    class Clashing:
        _loop = None

    with pytest.raises(pytest.fail.Exception, match=r"now defines \['_loop'\]"):
        HOOK.no_clash(Clashing, OWN)
