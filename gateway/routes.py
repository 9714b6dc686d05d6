"""The HTTP API besides generation (which :mod:`gateway.proxy` serves on a lean path): the
model list (the caller's key sees the models it may use), health, readiness and metrics
(which :class:`gateway.app.RidgeApp` guards: admin listener or admin key)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.errors import error_body
from gateway.keys import ANONYMOUS
from gateway.services import GatewayDep

router = APIRouter()


@router.get("/v1/models")
async def list_models(request: Request, gateway: GatewayDep) -> dict[str, Any]:
    """The models a healthy endpoint serves, of those the caller's key may use."""
    caller = ANONYMOUS
    if gateway.access is not None:
        header = request.headers.get("authorization")
        caller = gateway.access.authenticate(header.encode("latin-1") if header else None)
    created = int(time.time())
    data = [
        {"id": model, "object": "model", "created": created, "owned_by": "ridge"}
        for model in gateway.registry.models_available()
        if caller.record is None or caller.record.allows(model)
    ]
    return {"object": "list", "data": data}


@router.get("/health")
async def health() -> dict[str, str]:
    """Liveness: the gateway process answers."""
    return {"status": "ok"}


@router.get("/ready")
async def ready(gateway: GatewayDep) -> Response:
    """Readiness: at least one endpoint is healthy, so requests can be served, and the
    gateway is not draining (told to stop: :mod:`gateway.shutdown`)."""
    if gateway.lifecycle.draining:
        body = error_body(503, "the gateway is stopping", code="draining")
        return JSONResponse(body, status_code=503)
    healthy = sum(len(p.healthy_endpoints) for p in gateway.registry.snapshot())
    if healthy == 0:
        body = error_body(503, "no healthy endpoint", code="no_healthy_endpoint")
        return JSONResponse(body, status_code=503)
    return JSONResponse({"status": "ready", "healthy_endpoints": healthy})


@router.get("/metrics")
async def metrics(gateway: GatewayDep) -> Response:
    return Response(await gateway.metrics_page(), media_type=CONTENT_TYPE_LATEST)
