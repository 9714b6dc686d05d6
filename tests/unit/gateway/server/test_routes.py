"""The routes besides the proxy: the model list, one model (as OpenAI answers it, a key seeing
only its models), and ridge's version — over a stand-in gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient

from gateway.access.control import Access
from gateway.access.keys import KeyRecord, KeyRing, make_record, new_key
from gateway.access.limits import LocalLimiter
from gateway.server.errors import install_error_handlers
from gateway.server.routes import ridge_version, router

MODELS = ("org/model-a", "model-b")
ADAPTERS = {"sql-lora": "model-b"}
KEY, NARROW_KEY = new_key(), new_key()


@dataclass
class Registry:
    available: tuple[str, ...] = MODELS

    def model_parents(self) -> dict[str, str | None]:
        return {m: ADAPTERS.get(m) for m in self.available}


@dataclass
class StandInGateway:
    registry: Registry
    access: Access | None = None


@dataclass
class StaticKeys:
    records: list[KeyRecord]

    async def load(self) -> list[KeyRecord] | None:
        return self.records


def client_of(gateway: StandInGateway) -> TestClient:
    api = FastAPI()
    install_error_handlers(api)
    api.include_router(router)
    api.state.gateway = gateway
    return TestClient(api)


@pytest.fixture
async def keyed() -> AsyncIterator[TestClient]:
    """Keys required: one for every model, one for ``model-b`` only."""
    ring = KeyRing([StaticKeys([make_record(KEY, "all"),
                                make_record(NARROW_KEY, "narrow", models=["model-b"])])])
    await ring.refresh()
    client = client_of(StandInGateway(Registry(), Access(ring, LocalLimiter())))
    yield client
    client.close()


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_one_model_is_openais_model_object_and_a_name_may_hold_a_slash() -> None:
    http = client_of(StandInGateway(Registry()))
    for model in MODELS:
        card = http.get(f"/v1/models/{model}").json()
        assert card["id"] == model and card["object"] == "model" and card["owned_by"] == "ridge"
        assert isinstance(card["created"], int)
    listed = http.get("/v1/models").json()["data"]
    assert [m["id"] for m in listed] == list(MODELS)


@pytest.mark.parametrize("model", ["unknown", "org", "model-b/extra"])
def test_a_model_not_served_is_a_404_model_not_found(model: str) -> None:
    reply = client_of(StandInGateway(Registry())).get(f"/v1/models/{model}")
    assert reply.status_code == 404
    assert reply.json()["error"]["code"] == "model_not_found"
    assert reply.json()["error"]["param"] == "model"


def test_a_model_no_healthy_endpoint_serves_is_not_found() -> None:
    http = client_of(StandInGateway(Registry(available=("model-b",))))
    assert http.get("/v1/models/org/model-a").status_code == 404


def test_a_key_retrieves_only_the_models_it_may_use(keyed: TestClient) -> None:
    assert keyed.get("/v1/models/model-b", headers=bearer(NARROW_KEY)).status_code == 200
    refused = keyed.get("/v1/models/org/model-a", headers=bearer(NARROW_KEY))
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"
    assert keyed.get("/v1/models/org/model-a", headers=bearer(KEY)).status_code == 200
    assert keyed.get("/v1/models/model-b").status_code == 401
    listed = keyed.get("/v1/models", headers=bearer(NARROW_KEY)).json()["data"]
    assert [m["id"] for m in listed] == ["model-b"]


def test_the_version_is_ridges_and_says_nothing_else() -> None:
    reply = client_of(StandInGateway(Registry())).get("/version")
    assert reply.json() == {"version": ridge_version()} and ridge_version() != "unknown"


def test_an_adapter_is_listed_with_its_base_model_as_parent() -> None:
    http = client_of(StandInGateway(Registry((*MODELS, "sql-lora"))))
    listed = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
    assert listed["sql-lora"]["parent"] == "model-b" and listed["sql-lora"]["root"] == "sql-lora"
    assert listed["model-b"]["parent"] is None and listed["model-b"]["root"] == "model-b"
    assert http.get("/v1/models/sql-lora").json()["parent"] == "model-b"


async def test_a_key_sees_an_adapter_only_when_it_may_use_it_by_name() -> None:
    ring = KeyRing([StaticKeys([make_record(NARROW_KEY, "narrow", models=["model-b"])])])
    await ring.refresh()
    http = client_of(StandInGateway(Registry((*MODELS, "sql-lora")),
                                    Access(ring, LocalLimiter())))
    listed = http.get("/v1/models", headers=bearer(NARROW_KEY)).json()["data"]
    assert [m["id"] for m in listed] == ["model-b"]
    reply = http.get("/v1/models/sql-lora", headers=bearer(NARROW_KEY))
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "model_not_found"
