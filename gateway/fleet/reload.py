"""Fleet reload: SIGHUP, or ``POST /admin/reload``, reads the fleet file again and applies it
without a restart and without dropping a request.

:meth:`Reloader.reload` (one at a time): read and validate the file and build the new request
path (router, admission control, API-key headers) as at start-up — anything wrong keeps the
fleet in use, logs one WARNING and answers the admin call 400 ``invalid_fleet``; resolve its
``resolve: dns`` pools; apply everything in one step of the event loop (registry, a new
:class:`~gateway.request.proxy.Proxy`, SLOs, the MFU/MBU accounting); then let idle departed
endpoints go, probe new ones, and log one INFO line of what changed.

A request keeps, to its end, the router and admission control it started with. What is applied
live and what waits for a restart (``routing.features``, settings ``RIDGE_*``) is listed in
docs/gateway.md#fleet-reload.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from backends.registry.changes import FleetChanges
from backends.registry.poller import Poller
from config.fleet import Fleet, FleetConfigError, load_fleet
from gateway.fleet.views import LiveEfficiency
from gateway.request.dispatch import EngineHeaders, engine_headers
from gateway.request.proxy import Proxy
from gateway.server.errors import error_body
from gateway.services import Gateway
from gateway.telemetry.slos import slo_policy

log = logging.getLogger("ridge")

Serving = Callable[[Fleet, EngineHeaders], Proxy]
"""Builds the request path (dispatcher, router, admission control, proxy) for a fleet."""
RELOAD_PATH = "/admin/reload"


class ReloadRejected(Exception):
    """The fleet file cannot be applied; ``reason`` says why (the fleet in use stays)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ReloadReport:
    """What a reload applied: the changes, the totals after it, and what waits for a restart."""

    changes: FleetChanges
    pools: int
    endpoints: int
    draining: int
    restart_needed: tuple[str, ...] = ()

    def summary(self) -> str:
        c = self.changes
        text = (f"pools +{len(c.pools_added)} -{len(c.pools_removed)} "
                f"~{len(c.pools_changed)} ({self.pools} now), endpoints +{len(c.added)} "
                f"-{len(c.drained)} ({self.endpoints} now, {self.draining} draining)")
        if self.restart_needed:
            text += "; not applied until a restart: " + "; ".join(self.restart_needed)
        return text

    def body(self) -> dict[str, Any]:
        c = self.changes
        return {"status": "applied",
                "pools": {"added": list(c.pools_added), "removed": list(c.pools_removed),
                          "changed": list(c.pools_changed), "total": self.pools},
                "endpoints": {"added": len(c.added), "draining": len(c.drained),
                              "total": self.endpoints},
                "restart_needed": list(self.restart_needed)}


class Reloader:
    """Reloads the fleet of one running gateway (module docstring). ``serving``: how the app
    builds the request path for a fleet; ``path``: the fleet file (None: a reload is refused)."""

    def __init__(self, gateway: Gateway, poller: Poller, serving: Serving,
                 path: str | None, environ: Mapping[str, str] = os.environ) -> None:
        self._gateway, self._poller, self._serving = gateway, poller, serving
        self._path, self._environ = path, environ
        self._models = frozenset(m for p in gateway.fleet.pools
                                 for m in (*p.models, *p.adapter_names()))
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._listening = False
        efficiency = LiveEfficiency(gateway.telemetry, gateway.registry, gateway.fleet,
                                    gateway.state)
        gateway.registry.watch(efficiency.rebind)

    async def reload(self) -> ReloadReport:
        """Read the fleet file and apply it; :class:`ReloadRejected` (logged) when it cannot."""
        async with self._lock:
            try:
                fleet, proxy, later = self._prepare()
            except ReloadRejected as exc:
                log.warning("fleet reload rejected, the fleet in use stays: %s",
                            "; ".join(line.strip() for line in exc.reason.splitlines()))
                raise
            resolved = await self._poller.resolve(fleet.pools)
            report = self._apply(fleet, proxy, resolved, later)
            self._poller.sweep()
            await self._poller.probe(report.changes.added)
            log.info("fleet reloaded from %s: %s", self._path, report.summary())
            return report

    def _prepare(self) -> tuple[Fleet, Proxy, tuple[str, ...]]:
        """The new fleet (with the parts that wait for a restart as they run now), its request
        path, and what waits for a restart."""
        if self._path is None:
            raise ReloadRejected("no fleet file to read again: set RIDGE_CONFIG to its path")
        try:
            fleet, later = self._live_part(load_fleet(self._path))
            return fleet, self._serving(fleet, engine_headers(fleet, self._environ)), later
        except FleetConfigError as exc:
            raise ReloadRejected(str(exc)) from exc
        except Exception as exc:  # noqa: BLE001 - whatever fails to build keeps the old fleet
            log.debug("building the reloaded fleet failed", exc_info=exc)
            raise ReloadRejected(f"{self._path}: cannot be applied: {exc}") from exc

    def _live_part(self, fleet: Fleet) -> tuple[Fleet, tuple[str, ...]]:
        """``fleet`` with the running ``routing.features``, and what it changes that only a
        restart applies."""
        running, later = self._gateway.fleet.routing.features, []
        if fleet.routing.features != running:
            later.append("routing.features (request measure, tokenizers)")
            routing = fleet.routing.model_copy(update={"features": running})
            fleet = fleet.model_copy(update={"routing": routing})
        new = sorted({m for p in fleet.pools for m in (*p.models, *p.adapter_names())}
                     - self._models)
        if new:
            later.append(f"the model label of {', '.join(new)} (their metrics say 'other')")
        return fleet, tuple(later)

    def _apply(self, fleet: Fleet, proxy: Proxy, resolved: Mapping[str, Sequence[str]],
               later: tuple[str, ...]) -> ReloadReport:
        """Swap everything at once (no await in here)."""
        gateway = self._gateway
        changes = gateway.registry.apply_fleet(fleet, resolved)
        gateway.proxy, gateway.fleet = proxy, fleet
        gateway.telemetry.use_slos(slo_policy(fleet))
        registry = gateway.registry
        return ReloadReport(changes, len(registry.pools), len(registry.active_urls),
                            len(registry.draining), later)

    # -- SIGHUP ------------------------------------------------------------------------------

    def listen(self) -> None:
        """Reload on SIGHUP (where the event loop can take signals)."""
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._hang_up)
        except (NotImplementedError, RuntimeError, ValueError, AttributeError) as exc:
            log.info("SIGHUP does not reload the fleet here (%s); POST %s does", exc,
                     RELOAD_PATH)
            return
        self._listening = True

    def _hang_up(self) -> None:
        task = asyncio.get_running_loop().create_task(self._reload_logged(),
                                                      name="ridge-fleet-reload")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reload_logged(self) -> None:
        try:
            await self.reload()
        except ReloadRejected:
            pass  # logged
        except Exception:
            log.exception("fleet reload failed")

    async def close(self) -> None:
        """Stop listening for SIGHUP; a reload under way is cancelled."""
        if self._listening:
            self._listening = False
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)


router = APIRouter()


@router.post(RELOAD_PATH)
async def reload_fleet(request: Request) -> JSONResponse:
    """Read the fleet file again and apply it (an admin route: admin listener or admin key).
    200 with what changed, or 400 with why the file cannot be applied (the fleet in use
    stays)."""
    reloader: Reloader = request.app.state.reloader
    try:
        report = await reloader.reload()
    except ReloadRejected as exc:
        return JSONResponse(error_body(400, exc.reason, code="invalid_fleet"), status_code=400)
    return JSONResponse(report.body())
