"""gateway.fleet.reload: a fleet file read again is validated first (a bad one keeps the fleet
in use and says why, once), a good one is applied (pools, endpoints, the request path swapped
whole), what needs a restart is named, and SIGHUP and ``POST /admin/reload`` (an admin route) both
reload. The app runs its lifespan in the test's loop; the engines' ports refuse connections."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry

from config.fleet import load_fleet
from gateway.app import ADMIN_PATHS, RidgeApp, create_app
from gateway.fleet.reload import Reloader, ReloadRejected
from gateway.services import Gateway
from tests.fakes.harness import HARDWARE, MODEL_FACTS, closed_port_url, quick_settings

DOWN_A, DOWN_B, DOWN_C = closed_port_url(), closed_port_url(), closed_port_url()


def pool(name: str, urls: list[str], **extra: Any) -> dict[str, Any]:
    return {"name": name, "engine": "vllm", "models": ["m"], "endpoints": urls,
            "model": MODEL_FACTS, "hardware": HARDWARE, **extra}


def fleet_text(*pools: dict[str, Any], **top: Any) -> str:
    return yaml.safe_dump({"pools": list(pools), **top})


@contextlib.asynccontextmanager
async def running(path: Path, **settings: Any) -> AsyncIterator[RidgeApp]:
    """The app for the fleet file at ``path``, its lifespan running (no listener)."""
    overrides = {"config": str(path), **settings}
    config = quick_settings(registry={"startup_wait_s": 2.0, "poll_interval_s": 60.0},
                            **overrides)
    app = create_app(config, load_fleet(path), metrics_registry=CollectorRegistry())
    async with app.api.router.lifespan_context(app.api):
        yield app


def parts(app: RidgeApp) -> tuple[Gateway, Reloader]:
    return app.state.gateway, app.state.reloader


@pytest.fixture
def fleet_file(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(fleet_text(pool("a", [DOWN_A, DOWN_B]), pool("b", [DOWN_C])))
    return path


@pytest.mark.parametrize(("text", "reason"), [
    ("pools: [", "not valid YAML"),
    (fleet_text(pool("a", [DOWN_A]), pool("a", [DOWN_B])), "pool names must be unique"),
    (fleet_text(pool("a", [DOWN_A], levers={"speculative": {"num_draft_tokens": 0}})),
     "pools.0.levers.speculative.num_draft_tokens"),
    (fleet_text(pool("a", [DOWN_A], api_key_env="RIDGE_TEST_UNSET_KEY")),
     "api_key_env RIDGE_TEST_UNSET_KEY is not set"),
])
async def test_a_bad_file_keeps_the_fleet_in_use_and_says_why_once(
        fleet_file: Path, text: str, reason: str, caplog: pytest.LogCaptureFixture) -> None:
    async with running(fleet_file) as app:
        gateway, reloader = parts(app)
        fleet, proxy, urls = gateway.fleet, gateway.proxy, gateway.registry.urls
        fleet_file.write_text(text)
        caplog.set_level(logging.INFO, logger="ridge")
        with pytest.raises(ReloadRejected, match=reason):
            await reloader.reload()
        assert gateway.fleet is fleet and gateway.proxy is proxy
        assert gateway.registry.urls == urls and gateway.registry.draining == ()
        lines = [r for r in caplog.records if "fleet reload" in r.getMessage()]
        assert len(lines) == 1 and lines[0].levelno == logging.WARNING
        assert lines[0].getMessage().startswith("fleet reload rejected, the fleet in use stays")
        assert reason in lines[0].getMessage() and "\n" not in lines[0].getMessage()


async def test_a_good_file_is_applied_in_one_step(fleet_file: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    async with running(fleet_file) as app:
        gateway, reloader = parts(app)
        old_proxy = gateway.proxy
        fleet_file.write_text(fleet_text(
            pool("a", [DOWN_B, DOWN_C], levers={"prefix_caching": True}),  # one out, one in
            pool("c", ["http://localhost:1"], resolve="dns"),  # b removed, c added
            slos={"m": {"ttft_s": 0.5}}))
        caplog.set_level(logging.INFO, logger="ridge")
        report = await reloader.reload()
        registry = gateway.registry
        assert [p.name for p in registry.snapshot()] == ["a", "c"]
        assert registry.pool_urls("a") == (DOWN_B, DOWN_C)
        assert "http://127.0.0.1:1" in registry.pool_urls("c")  # looked up by the reload
        assert registry.draining == () and DOWN_A not in registry.urls  # nothing in flight
        assert gateway.proxy is not old_proxy and gateway.fleet.pool("c").resolve == "dns"
        assert gateway.telemetry.slos.models["m"].bounds.ttft_s == 0.5
        body = report.body()
        assert body["pools"] == {"added": ["c"], "removed": ["b"], "changed": ["a"],
                                 "total": 2}
        assert body["endpoints"]["added"] >= 2 and body["restart_needed"] == []
        lines = [r.getMessage() for r in caplog.records if "fleet reload" in r.getMessage()]
        assert lines == [f"fleet reloaded from {fleet_file}: {report.summary()}"]
        assert "pools +1 -1 ~1 (2 now)" in lines[0]
        old_proxy = gateway.proxy
        report = await reloader.reload()  # the same file again: nothing changes
        assert not report.changes and gateway.proxy is not old_proxy


async def test_what_needs_a_restart_is_named_and_kept_as_it_runs(fleet_file: Path) -> None:
    async with running(fleet_file) as app:
        gateway, reloader = parts(app)
        features = gateway.fleet.routing.features
        fleet_file.write_text(fleet_text(
            pool("a", [DOWN_A], models=["m", "new-model"]), pool("b", [DOWN_C]),
            routing={"features": {"block_tokens": 32}}))
        report = await reloader.reload()
        assert report.restart_needed == (
            "routing.features (request measure, tokenizers)",
            "the model label of new-model (their metrics say 'other')")
        assert gateway.fleet.routing.features == features  # the running one stays
        assert gateway.fleet.pool("a").models == ["m", "new-model"]  # routed at once
        assert "not applied until a restart: routing.features" in report.summary()


async def test_without_a_fleet_file_path_a_reload_is_refused(fleet_file: Path) -> None:
    async with running(fleet_file, config=None) as app:
        with pytest.raises(ReloadRejected, match="set RIDGE_CONFIG"):
            await parts(app)[1].reload()


async def test_the_admin_call_answers_what_changed_or_a_400(fleet_file: Path) -> None:
    assert "/admin/reload" in ADMIN_PATHS
    async with running(fleet_file, admin_port=9091) as app:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport) as http:
            main = await http.post("http://ridge:8080/admin/reload")
            assert main.status_code == 404  # not on the main port when there is an admin one
            admin = "http://ridge:9091/admin/reload"
            fleet_file.write_text(fleet_text(pool("a", [DOWN_A])))
            applied = await http.post(admin)
            assert applied.status_code == 200
            assert applied.json()["pools"]["removed"] == ["b"]
            fleet_file.write_text("pools: 3\n")
            refused = await http.post(admin)
            assert refused.status_code == 400
            error = refused.json()["error"]
            assert error["code"] == "invalid_fleet" and error["type"] == "invalid_request_error"
            assert "pools" in error["message"]
        assert [p.name for p in parts(app)[0].fleet.pools] == ["a"]


async def test_sighup_reloads(fleet_file: Path) -> None:
    async with running(fleet_file) as app:
        gateway = parts(app)[0]
        assert signal.getsignal(signal.SIGHUP) not in (signal.SIG_DFL, None)  # listening
        fleet_file.write_text(fleet_text(pool("a", [DOWN_A])))
        os.kill(os.getpid(), signal.SIGHUP)
        for _ in range(500):  # bounded: a hang detector only
            if len(gateway.fleet.pools) == 1:
                break
            await asyncio.sleep(0.01)
        assert [p.name for p in gateway.fleet.pools] == ["a"]
    assert signal.getsignal(signal.SIGHUP) in (signal.SIG_DFL, None)  # no longer listening
