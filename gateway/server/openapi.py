"""The OpenAPI document of the routes ridge serves, the engine routes included.

FastAPI documents the routes it serves itself (models, health, metrics, admin). The engine
routes (:data:`gateway.request.proxy.PROXIED_PATHS`) bypass it on the hot path, so
:func:`openapi_with_engine_routes` adds them: per API the request fields ridge reads (the
others are forwarded untouched, so every schema allows more), the answer's shape as vLLM and
SGLang give it, the stream for the APIs that stream, and ridge's own errors (OpenAI-shaped).
Shapes: docs/api.md; the fields ridge checks: docs/gateway.md#request-bodies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from gateway.request.body import GENERATION, ApiPath


def _object(required: tuple[str, ...] = (), **properties: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties,
                              "additionalProperties": True}
    if required:
        schema["required"] = list(required)
    return schema


_STR, _INT, _BOOL = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}
_ANY_ARRAY = {"type": "array", "items": {}}
_MESSAGES = {"type": "array", "minItems": 1, "items": _object(
    ("role",), role=_STR, content={"oneOf": [_STR, _ANY_ARRAY]})}
_USAGE = _object(prompt_tokens=_INT, completion_tokens=_INT, total_tokens=_INT,
                 prompt_tokens_details=_object(cached_tokens=_INT))
_GENERATE = {"model": _STR, "stream": _BOOL,
             "stream_options": _object(include_usage=_BOOL), "max_tokens": _INT,
             "max_completion_tokens": _INT, "user": _STR}
_LIST = {"type": "array", "items": _object()}

ROUTES: Mapping[ApiPath, tuple[str, dict[str, Any], dict[str, Any]]] = MappingProxyType({
    ApiPath.CHAT: ("Chat completion", _object(("model", "messages"), messages=_MESSAGES,
                                              **_GENERATE),
                   _object(id=_STR, object={"const": "chat.completion"}, model=_STR,
                           choices={"type": "array", "items": _object(
                               index=_INT, finish_reason=_STR,
                               message=_object(role=_STR, content=_STR))}, usage=_USAGE)),
    ApiPath.COMPLETIONS: ("Text completion", _object(
        ("model", "prompt"), prompt={"oneOf": [_STR, _ANY_ARRAY]}, **_GENERATE),
        _object(id=_STR, object={"const": "text_completion"}, model=_STR,
                choices={"type": "array", "items": _object(index=_INT, text=_STR,
                                                          finish_reason=_STR)},
                usage=_USAGE)),
    ApiPath.RESPONSES: ("Response (the Responses API)", _object(
        ("model", "input"), model=_STR, input={"oneOf": [_STR, _ANY_ARRAY]},
        instructions=_STR, stream=_BOOL, max_output_tokens=_INT, user=_STR),
        _object(id=_STR, object={"const": "response"}, status=_STR, output=_LIST,
                usage=_object(input_tokens=_INT, output_tokens=_INT, total_tokens=_INT))),
    ApiPath.EMBEDDINGS: ("Embeddings", _object(
        ("model",), model=_STR, input={"oneOf": [_STR, _ANY_ARRAY]}, messages=_MESSAGES,
        user=_STR),
        _object(object={"const": "list"}, data={"type": "array", "items": _object(
            index=_INT, embedding=_ANY_ARRAY)}, usage=_USAGE)),
    ApiPath.TOKENIZE: ("Tokenize (vLLM, SGLang)", _object(
        ("model",), model=_STR, prompt=_STR, messages=_MESSAGES),
        _object(count=_INT, max_model_len=_INT, tokens={"type": "array", "items": _INT})),
    ApiPath.DETOKENIZE: ("Detokenize (vLLM, SGLang)", _object(
        ("model", "tokens"), model=_STR, tokens={"type": "array", "items": _INT}),
        _object(prompt=_STR)),
    **{path: ("Score pairs (vLLM)", _object(("model",), model=_STR),
              _object(data={"type": "array", "items": _object(index=_INT,
                                                             score={"type": "number"})}))
       for path in (ApiPath.SCORE, ApiPath.SCORE_V1)},
    **{path: ("Rerank documents (vLLM, SGLang)", _object(
        ("model", "query", "documents"), model=_STR, query=_STR, documents=_ANY_ARRAY),
        _object(results={"type": "array", "items": _object(
            index=_INT, relevance_score={"type": "number"})}))
       for path in (ApiPath.RERANK, ApiPath.RERANK_V1, ApiPath.RERANK_V2)},
})
"""Per engine route: its summary, the request body's schema, a whole 200 answer's schema."""

ERROR = _object(("error",), error=_object(("message", "type"), message=_STR, type=_STR,
                                          param={"type": ["string", "null"]},
                                          code={"type": ["string", "null"]}))
"""ridge's own errors (and an engine's, relayed as it wrote them)."""
_ERRORS = {
    "400": "a field ridge reads is missing or of the wrong type; the body is not JSON",
    "401": "no key, or an unknown one, while keys are required",
    "404": "no pool serves the model",
    "413": "the body is larger than RIDGE_MAX_BODY_BYTES",
    "415": "the body is not declared JSON",
    "429": "the key's rate or token limit (retry-after says when)",
    "502": "no engine gave a whole answer",
    "503": "no healthy engine, or the pool is at capacity (retry-after says when)",
    "504": "the request passed its deadline",
}


def engine_paths() -> dict[str, Any]:
    """The OpenAPI ``paths`` of the engine routes."""
    paths: dict[str, Any] = {}
    for api_path, (summary, request, answer) in ROUTES.items():
        content: dict[str, Any] = {"application/json": {"schema": answer}}
        if api_path in GENERATION:
            content["text/event-stream"] = {"schema": _STR}  # with "stream": true
        responses = {"200": {"description": "the engine's answer, relayed", "content": content}}
        responses |= {status: {"description": why, "content": {
            "application/json": {"schema": ERROR}}} for status, why in _ERRORS.items()}
        paths[api_path.value] = {"post": {
            "summary": summary, "tags": ["engine routes"],
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": request}}},
            "responses": responses}}
    return paths


def openapi_with_engine_routes(api: FastAPI) -> Callable[[], dict[str, Any]]:
    """``api.openapi``: FastAPI's document of its own routes with the engine routes added,
    built once."""
    def openapi() -> dict[str, Any]:
        if api.openapi_schema is None:
            document = get_openapi(title=api.title, version=api.version, routes=api.routes)
            document["paths"] = {**engine_paths(), **document.get("paths", {})}
            api.openapi_schema = document
        return api.openapi_schema
    return openapi
