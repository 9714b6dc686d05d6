"""The HTTP API besides what engines answer (which :mod:`gateway.request.proxy` serves on a lean
path): the model list and one model (the caller's key sees the models it may use: any other
is OpenAI's 404 ``model_not_found``; a LoRA adapter is listed as a model of its own, its base
model as ``parent``, as vLLM lists it), ridge's version, health, readiness, metrics, the
fleet's status and the live page that draws it (which :class:`gateway.app.RidgeApp` places
and guards: admin listener or admin key; the page's files hold no data and need no key)."""

from __future__ import annotations

import importlib.metadata
import time
from importlib.resources import files
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.access.keys import ANONYMOUS, Caller, model_refused
from gateway.server.errors import error_body
from gateway.services import Gateway, GatewayDep
from gateway.telemetry.status import sample, status

router = APIRouter()


def _caller(request: Request, gateway: Gateway) -> Caller:
    """Who calls (401 when a key is required and missing or unknown)."""
    if gateway.access is None:
        return ANONYMOUS
    header = request.headers.get("authorization")
    return gateway.access.authenticate(header.encode("latin-1") if header else None)


def _visible(gateway: Gateway, caller: Caller) -> dict[str, str | None]:
    """The models a healthy endpoint serves, of those ``caller``'s key may use (an adapter by
    its own name), each → its parent (None for a base model, the base model for an adapter)."""
    return {model: parent for model, parent in gateway.registry.model_parents().items()
            if caller.record is None or caller.record.allows(model)}


def _model_card(model: str, parent: str | None, created: int) -> dict[str, Any]:
    """OpenAI's model object, with vLLM's ``root`` and ``parent``: ``parent`` is the base
    model of a LoRA adapter (None for a base model); ``root`` is the card's own name (ridge
    does not show the engines' file paths, where vLLM does)."""
    return {"id": model, "object": "model", "created": created, "owned_by": "ridge",
            "root": model, "parent": parent}


@router.get("/v1/models")
async def list_models(request: Request, gateway: GatewayDep) -> dict[str, Any]:
    """The models a healthy endpoint serves, of those the caller's key may use."""
    created = int(time.time())
    visible = _visible(gateway, _caller(request, gateway))
    data = [_model_card(model, parent, created) for model, parent in visible.items()]
    return {"object": "list", "data": data}


@router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, request: Request, gateway: GatewayDep) -> dict[str, Any]:
    """One model of :func:`list_models` (a name may hold ``/``); any other — unknown, served by
    no healthy endpoint, or not one the caller's key may use — is a 404 ``model_not_found``."""
    visible = _visible(gateway, _caller(request, gateway))
    if model not in visible:
        raise model_refused(model)
    return _model_card(model, visible[model], int(time.time()))


def ridge_version() -> str:
    """ridge's own version, as installed (``unknown`` from a source tree never installed)."""
    try:
        return importlib.metadata.version("ridge")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@router.get("/version")
async def version() -> dict[str, str]:
    """ridge's version, as vLLM's ``/version`` gives its own (``{"version": ...}``); nothing
    about the engines or the configuration."""
    return {"version": ridge_version()}


@router.get("/health")
async def health() -> dict[str, str]:
    """Liveness: the gateway process answers."""
    return {"status": "ok"}


@router.get("/ready")
async def ready(gateway: GatewayDep) -> Response:
    """Readiness: at least one endpoint is healthy, so requests can be served, and the
    gateway is not draining (told to stop: :mod:`gateway.server.shutdown`)."""
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


@router.get("/status")
async def fleet_status(gateway: GatewayDep) -> JSONResponse:
    """The fleet at a glance over the last minute (:mod:`gateway.telemetry.status`)."""
    old, new = gateway.status_history.add(sample(await gateway.metrics_page(), time.monotonic()))
    return JSONResponse(status(new, old, gateway.registry.snapshot(), ridge_version()))


PAGE_FILES = {"/dashboard": ("index.html", "text/html; charset=utf-8"),
              "/dashboard/app.js": ("app.js", "text/javascript; charset=utf-8"),
              "/dashboard/style.css": ("style.css", "text/css; charset=utf-8")}
"""The live page's files (in the package, beside this module) by path, with their types."""
_PAGE_HEADERS = {"content-security-policy": "default-src 'self'; img-src 'self' data:",
                 "x-content-type-options": "nosniff", "cache-control": "no-cache"}


def _page_file(path: str) -> Response:
    name, media = PAGE_FILES[path]
    body = files("gateway.server").joinpath("dashboard", name).read_bytes()
    return Response(body, media_type=media, headers=_PAGE_HEADERS)


@router.get("/dashboard", include_in_schema=False)
async def dashboard() -> Response:
    """The live page of the fleet, drawn from :func:`fleet_status` every 2 s."""
    return _page_file("/dashboard")


@router.get("/dashboard/{name}", include_in_schema=False)
async def dashboard_file(name: str) -> Response:
    path = f"/dashboard/{name}"
    if path not in PAGE_FILES:
        return JSONResponse(error_body(404, f"Not Found (GET {path})", code="not_found"),
                            status_code=404)
    return _page_file(path)
