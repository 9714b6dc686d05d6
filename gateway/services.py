"""The parts of one running gateway, shared by every route through ``Depends``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from backends.registry.endpoints import EndpointRegistry
from config.fleet import Fleet
from gateway.access.control import Access
from gateway.request.proxy import Proxy
from gateway.server.shutdown import Lifecycle
from gateway.settings import Settings
from gateway.state.shared_memory import WorkerContext
from gateway.telemetry.page import page
from gateway.telemetry.prometheus import Telemetry
from gateway.telemetry.status import StatusHistory
from gateway.workers.merged_metrics import merged_page
from routing.state.protocol import RouterState


@dataclass
class Gateway:
    """One running gateway: created in the app's lifespan, stored on ``app.state``.
    ``worker``: its place among ``ridge serve --workers N`` (None: the only process);
    ``lifecycle``: whether it is draining; ``status_history``: the samples ``/status`` counts
    its window from."""

    settings: Settings
    fleet: Fleet
    registry: EndpointRegistry
    telemetry: Telemetry
    proxy: Proxy
    state: RouterState
    worker: WorkerContext | None = None
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    access: Access | None = None
    status_history: StatusHistory = field(default_factory=StatusHistory)

    def own_metrics(self) -> bytes:
        """This process's Prometheus page (``_created`` series only when the settings ask)."""
        return page(self.telemetry.metrics_registry, self.settings.metrics_created)

    async def metrics_page(self) -> bytes:
        """The gateway's Prometheus page: with workers, every worker's merged."""
        own = self.own_metrics()
        if self.worker is None:
            return own
        return await merged_page(own, self.worker.peers)


async def get_gateway(request: Request) -> Gateway:
    """Async on purpose: FastAPI runs a plain ``def`` dependency in a worker thread."""
    gateway: Gateway = request.app.state.gateway
    return gateway


GatewayDep = Annotated[Gateway, Depends(get_gateway)]
