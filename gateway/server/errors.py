"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}``.

Every failure ridge itself answers goes through :class:`GatewayError`, so clients written for
OpenAI's API read ridge's errors the same way. An engine's own error response is not rewritten:
it reaches the client as the engine wrote it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

# (HTTP status) -> OpenAI error type, as OpenAI's API and vLLM name them.
ERROR_TYPES: Mapping[int, str] = MappingProxyType(
    {
        400: "invalid_request_error",
        401: "invalid_request_error",
        403: "invalid_request_error",
        404: "not_found_error",
        405: "invalid_request_error",
        413: "invalid_request_error",
        429: "rate_limit_error",
        500: "internal_error",
        502: "bad_gateway",
        503: "service_unavailable",
        504: "timeout",
    }
)


class GatewayError(Exception):
    """An error ridge answers itself, with the HTTP status and OpenAI fields. ``detail``: what
    only the log may say (an engine's address, a library's exception text); never sent.
    ``headers``: extra response headers (lower-case names), e.g. ``retry-after``;
    ``kind``: the OpenAI error ``type`` when not the status's usual one; ``pool``: the pool
    the refusal is about (admission control), for the request's metrics."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None,
        detail: str | None = None, headers: tuple[tuple[bytes, bytes], ...] = (),
        kind: str | None = None, pool: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.detail = detail
        self.headers = headers
        self.kind = kind
        self.pool = pool

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, param=self.param, code=self.code,
                          kind=self.kind)


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None,
    kind: str | None = None,
) -> dict[str, Any]:
    kind = kind or ERROR_TYPES.get(
        status, "invalid_request_error" if status < 500 else "internal_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(exc: GatewayError) -> JSONResponse:
    headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in exc.headers}
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


async def _on_gateway_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GatewayError)
    return error_response(exc)


async def _on_http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = "not_found" if exc.status_code == 404 else None
    return JSONResponse(
        error_body(exc.status_code, str(exc.detail), code=code), status_code=exc.status_code
    )


async def _on_validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    param = ".".join(str(p) for p in first["loc"][1:]) or None
    return JSONResponse(error_body(400, str(first["msg"]), param=param), status_code=400)


async def _on_unexpected(_: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(
        error_body(500, f"internal error: {type(exc).__name__}", code="internal_error"),
        status_code=500,
    )


def install_error_handlers(app: FastAPI) -> None:
    """Make every error ridge answers OpenAI-shaped, including unknown routes and methods."""
    app.add_exception_handler(GatewayError, _on_gateway_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(Exception, _on_unexpected)
