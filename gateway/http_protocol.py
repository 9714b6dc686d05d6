"""ridge's HTTP/1.1 server protocol: uvicorn's httptools protocol, plus a disconnect watch.

A handler that awaits the engine must learn at once when its client goes away, so that it
closes the upstream request and the engine stops generating. With plain ASGI the only way is to
keep a ``receive()`` pending in a second task for every request. Instead, this protocol puts a
:class:`DisconnectWatch` into every request's scope (``scope["extensions"]["ridge.disconnect"]``)
and fires it when the connection is lost before the response is complete; the handler hands
the watch a callback (cancelling its own task) — no extra task per request.

Selected with ``uvicorn.Config(http=RidgeHttpProtocol)`` (:func:`gateway.cli.uvicorn_config`).
Handlers must also work without the watch (another ASGI server): see
:func:`gateway.proxy.watch_disconnect`.
"""

from __future__ import annotations

from collections.abc import Callable

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

WATCH = "ridge.disconnect"


class DisconnectWatch:
    """Calls its callback once, when the request's connection is lost before the response is
    complete. A callback set after that is called at once."""

    __slots__ = ("_callback", "fired")

    def __init__(self) -> None:
        self._callback: Callable[[], object] | None = None
        self.fired = False

    def on_disconnect(self, callback: Callable[[], object]) -> None:
        self._callback = callback
        if self.fired:
            callback()

    def clear(self) -> None:
        self._callback = None

    def fire(self) -> None:
        if self.fired:
            return
        self.fired = True
        if self._callback is not None:
            self._callback()


class RidgeHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a :class:`DisconnectWatch` per request."""

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = {WATCH: DisconnectWatch()}  # type: ignore[dict-item]

    def connection_lost(self, exc: Exception | None) -> None:
        cycles = [self.cycle, *(cycle for cycle, _ in self.pipeline)] if self.cycle else []
        super().connection_lost(exc)
        for cycle in cycles:
            if cycle is not None and not cycle.response_complete:
                watch = cycle.scope.get("extensions", {}).get(WATCH)
                if isinstance(watch, DisconnectWatch):
                    watch.fire()
