"""The parts of one running gateway, shared by every route through ``Depends``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from backends.fleet_file import Fleet
from backends.registry import EndpointRegistry
from gateway.proxy import Proxy
from gateway.settings import Settings
from gateway.telemetry import Telemetry
from routing.state import RouterState


@dataclass
class Gateway:
    """One running gateway: created in the app's lifespan, stored on ``app.state``."""

    settings: Settings
    fleet: Fleet
    registry: EndpointRegistry
    telemetry: Telemetry
    proxy: Proxy
    state: RouterState


async def get_gateway(request: Request) -> Gateway:
    """Async on purpose: FastAPI runs a plain ``def`` dependency in a worker thread."""
    gateway: Gateway = request.app.state.gateway
    return gateway


GatewayDep = Annotated[Gateway, Depends(get_gateway)]
