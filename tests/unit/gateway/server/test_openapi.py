"""gateway.server.openapi: /openapi.json documents every route ridge serves, the engine routes
with their request and answer shapes; /docs is off unless asked for."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import jsonschema
import pytest
from prometheus_client import CollectorRegistry
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.request.body import GENERATION
from gateway.request.proxy import PROXIED_PATHS
from gateway.server.openapi import ROUTES, engine_paths
from gateway.settings import Settings
from tests.fakes.harness import down_probe, fleet_of


@contextmanager
def _client(**settings: Any) -> Iterator[TestClient]:
    """ridge with its engines down (it starts without them)."""
    app = create_app(Settings(auth="off", registry={"startup_wait_s": 0}, **settings),
                     fleet_of({"p": ["http://127.0.0.1:9"]}),
                     metrics_registry=CollectorRegistry(), probe_factory=down_probe)
    with TestClient(app) as client:
        yield client


def _document() -> dict[str, Any]:
    with _client() as client:
        document: dict[str, Any] = client.get("/openapi.json").json()
    return document


def test_every_engine_route_is_documented_with_its_shapes() -> None:
    document = _document()
    assert set(PROXIED_PATHS) <= set(document["paths"])
    assert set(ROUTES) == set(PROXIED_PATHS.values())
    chat = document["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["required"] == [
        "model", "messages"]
    assert {"200", "400", "415", "429", "503"} <= set(chat["responses"])
    assert "text/event-stream" in chat["responses"]["200"]["content"]
    assert "/v1/models" in document["paths"] and "/health" in document["paths"]
    for path, item in engine_paths().items():
        streams = "text/event-stream" in item["post"]["responses"]["200"]["content"]
        assert streams == (PROXIED_PATHS[path] in GENERATION)


@pytest.mark.parametrize(("path", "body", "valid"), [
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                              "temperature": 0.2}, True),
    ("/v1/chat/completions", {"model": "m"}, False),
    ("/v1/completions", {"model": "m", "prompt": "Once", "stream": True}, True),
    ("/v1/embeddings", {"model": "m", "input": ["a", "b"]}, True),
    ("/v2/rerank", {"model": "m", "query": "q"}, False),
])
def test_the_request_schemas_accept_what_ridge_serves(path: str, body: dict[str, Any],
                                                      valid: bool) -> None:
    schema = engine_paths()[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(body))
    assert (not errors) is valid, errors


def test_the_interactive_docs_are_off_unless_asked() -> None:
    with _client() as client:
        assert client.get("/docs").status_code == 404
        assert client.get("/redoc").status_code == 404
    with _client(api_docs=True) as client:
        page = client.get("/docs")
    assert page.status_code == 200 and "swagger-ui" in page.text
