"""The HTTP API: OpenAI's generation and model endpoints, health, readiness and metrics."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.errors import GatewayError, error_body
from gateway.openai_request import Endpoint, parse_request
from gateway.services import Gateway, GatewayDep

router = APIRouter()


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing more than ``limit`` bytes with a 413 (checked as it arrives,
    so an oversized body is never held in memory whole)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> GatewayError:
    return GatewayError(
        413, f"request body exceeds the limit of {limit} bytes", code="request_too_large"
    )


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, gateway: GatewayDep) -> Response:
    return await _generate(Endpoint.CHAT, request, gateway)


@router.post("/v1/completions")
async def completions(request: Request, gateway: GatewayDep) -> Response:
    return await _generate(Endpoint.COMPLETIONS, request, gateway)


async def _generate(endpoint: Endpoint, request: Request, gateway: Gateway) -> Response:
    body = await read_body(request, gateway.settings.max_body_bytes)
    parsed = parse_request(endpoint, body)
    return await gateway.proxy.handle(parsed, request)


@router.get("/v1/models")
async def list_models(gateway: GatewayDep) -> dict[str, Any]:
    created = int(time.time())
    data = [
        {"id": model, "object": "model", "created": created, "owned_by": "ridge"}
        for model in gateway.registry.models_available()
    ]
    return {"object": "list", "data": data}


@router.get("/health")
async def health() -> dict[str, str]:
    """Liveness: the gateway process answers."""
    return {"status": "ok"}


@router.get("/ready")
async def ready(gateway: GatewayDep) -> Response:
    """Readiness: at least one endpoint is healthy, so requests can be served."""
    healthy = sum(len(p.healthy_endpoints) for p in gateway.registry.snapshot())
    if healthy == 0:
        body = error_body(503, "no healthy endpoint", code="no_healthy_endpoint")
        return JSONResponse(body, status_code=503)
    return JSONResponse({"status": "ready", "healthy_endpoints": healthy})


@router.get("/metrics")
async def metrics(gateway: GatewayDep) -> Response:
    return Response(generate_latest(gateway.telemetry.registry), media_type=CONTENT_TYPE_LATEST)
