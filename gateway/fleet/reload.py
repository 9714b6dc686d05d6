"""Fleet reload: SIGHUP, or ``POST /admin/reload``, reads the fleet file again and applies it
without a restart and without dropping a request.

One reload (:meth:`Reloader.reload`, one at a time):

1. Read and validate the file (the path ridge was given as ``RIDGE_CONFIG``), then build what
   the request path needs from it — the router (lever policy, every pool's scheduler),
   admission control against its SLOs, the engines' API-key headers — exactly as at start-up.
   Anything wrong (unreadable file, YAML, a field, a missing API-key variable): the fleet in
   use stays, one WARNING says why, and the admin call answers 400 with the reason
   (OpenAI-shaped, code ``invalid_fleet``).
2. Look the new fleet's ``resolve: dns`` pools up (:mod:`backends.registry.resolver`).
3. Apply, in one step of the event loop (no request sees half of it): the registry takes the
   new pools and endpoints (:meth:`backends.registry.endpoints.EndpointRegistry.apply_fleet`:
   endpoints
   that left drain — nothing new is sent there, the requests in flight finish — and leave
   once idle or after ``RIDGE_REGISTRY__DRAIN_TIMEOUT_S``; new ones start unhealthy); the
   gateway's :class:`~gateway.request.proxy.Proxy` is replaced by one built on the new router and
   admission control (the request path reads ``gateway.request.proxy`` once per request, so a
   request
   keeps, to its end, the router and admission control it started with, and its reservations
   are released where they were taken); telemetry takes the new SLOs, and the MFU/MBU
   accounting the new endpoints (:mod:`gateway.fleet.views`).
4. Let the endpoints that left with nothing in flight go at once, probe those that joined
   (bounded by the probe timeout), then log one INFO line: the pools and endpoints added,
   removed and changed, and what waits for a restart.

Applied live: pools (added, removed, changed), endpoints, levers, roles and pairs, engines,
model and hardware facts, API-key variables, ``resolve``, ``routing.policy``,
``routing.scheduler``, ``routing.plugins``, ``slos``. Needs a restart: ``routing.features``
(the request measure and the tokenizers are built once; the running ones stay, and the log
line says so), the ``model`` label of a model name the fleet did not serve at start-up (its
metrics say ``other`` until then), and every setting of the environment (``RIDGE_*``).
With ``ridge serve --workers N`` each worker reloads on its own: SIGHUP to the supervisor is
passed on to every worker (:mod:`gateway.workers.supervisor`); the admin call reaches one.
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

from backends.registry.endpoints import FleetChanges, Poller
from config.fleet_file import Fleet, FleetConfigError, load_fleet
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
