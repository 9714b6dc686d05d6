"""The gateways under test: ridge's fleet file, each gateway's command, the routers' install
plan and readiness (no router is started, nothing is installed; a fake smg on a free port)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import yaml
from aiohttp import web

from config.fleet import parse_fleet
from ridge_bench.harness.gateways import (
    BENCH_VENV,
    BY_KEY,
    GATEWAYS,
    ROUTERS,
    SMG,
    VLLM_ROUTER,
    Launch,
    alias_url,
    command,
    fleet,
    import_check,
    install_plan,
    peer,
    ready,
    router_python,
    router_ready,
    serving,
    smg_worker,
)
from ridge_bench.harness.procs import ROOT, Child
from ridge_bench.harness.upstream import MODEL, PACED_MODEL

URLS = [f"http://127.0.0.1:{19000 + i}" for i in range(8)]


def test_ridge_fleet_is_valid_and_serves_both_models() -> None:
    parsed = parse_fleet(fleet(URLS))
    (pool,) = parsed.pools
    assert [str(e).rstrip("/") for e in pool.endpoints] == URLS
    assert set(pool.models) == {MODEL, PACED_MODEL}
    assert "routing" not in fleet(URLS)  # every routing setting stays default


def test_installed_ridge_serves_the_rendered_fleet(tmp_path: Path) -> None:
    argv, env, cwd = command(BY_KEY["ridge"], Launch(), 8123, URLS, tmp_path)
    assert argv[-5:] == ["serve", "--config", str(tmp_path / "fleet.yaml"), "--port", "8123"]
    assert env == {} and cwd == ROOT
    assert yaml.safe_load((tmp_path / "fleet.yaml").read_text()) == fleet(URLS)


def test_ridge_from_another_source_tree_runs_there(tmp_path: Path) -> None:
    src = tmp_path / "old"
    argv, env, cwd = command(BY_KEY["ridge"], Launch(ridge_src=src), 1, URLS, tmp_path)
    assert argv[:3] == [sys.executable, "-m", "gateway.cli"]  # as older trees run it too
    assert env == {"PYTHONPATH": str(src)} and cwd == src


def test_ridge_with_the_aiohttp_transport_is_told_so(tmp_path: Path) -> None:
    argv, env, _ = command(BY_KEY["ridge-aiohttp"], Launch(), 8123, URLS, tmp_path)
    assert argv[-5:] == ["serve", "--config", str(tmp_path / "fleet.yaml"), "--port", "8123"]
    assert env == {"RIDGE_UPSTREAM__TRANSPORT": "aiohttp"}
    assert "ridge-aiohttp" not in {g.key for g in GATEWAYS}  # run only when asked for


def test_floors_and_the_sglang_router(tmp_path: Path) -> None:
    argv, _, _ = command(BY_KEY["aiohttp"], Launch(), 7, URLS, tmp_path)
    assert argv[2:6] == ["ridge_bench.overhead.passthrough", "--server", "aiohttp", "--port"]
    assert argv[-8:] == URLS
    argv, _, _ = command(BY_KEY["ridge-floor"], Launch(), 7, URLS, tmp_path)
    assert argv[2:5] == ["ridge_bench.overhead.passthrough", "--server", "ridge"]
    assert BY_KEY["ridge-floor"] in GATEWAYS  # ridge's transport alone, in every run
    with pytest.raises(RuntimeError, match="not installed"):
        command(BY_KEY["sglang-ca"], Launch(), 7, URLS, tmp_path)
    python = tmp_path / "python"
    argv, env, _ = command(BY_KEY["sglang-ca"], Launch(sglang_python=python), 7, URLS, tmp_path)
    assert argv[:3] == [str(python), "-m", "sglang_router.launch_router"]
    assert argv[argv.index("--policy") + 1] == "cache_aware" and env == {"PYTHONPATH": ""}


@pytest.mark.parametrize("kind", sorted(ROUTERS))
def test_a_peer_is_named_by_its_kind_and_launched_with_its_interpreter(kind: str,
                                                                     tmp_path: Path) -> None:
    gateway = peer(kind, "cache_aware")
    assert (gateway.key, gateway.kind, gateway.arg) == (kind, kind, "cache_aware")
    assert gateway.label == ROUTERS[kind].label("cache_aware")
    python = tmp_path / "python"
    launch = Launch().with_python(kind, python)
    assert launch.python(kind) == python
    assert [k for k in ROUTERS if launch.python(k) is not None] == [kind]
    argv, _, _ = command(gateway, launch, 7, URLS, tmp_path)
    assert argv[:3] == [str(python), "-m", ROUTERS[kind].module]


def test_every_gateway_has_a_unique_key() -> None:
    assert len({g.key for g in GATEWAYS}) == len(GATEWAYS)


ROUTER_KEYS = {"sglang-rr": "sglang", "sglang-ca": "sglang", "smg-rr": "smg", "smg-ca": "smg",
               "vllm-rr": "vllm-router", "vllm-ca": "vllm-router"}


def _launch_with(python: Path) -> Launch:
    return Launch(sglang_python=python, smg_python=python, vllm_router_python=python)


def _value(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, flag
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("key", sorted(ROUTER_KEYS))
def test_each_router_runs_pinned_on_loopback_with_a_free_metrics_port(key: str,
                                                                        tmp_path: Path) -> None:
    python = tmp_path / "bin" / "python"
    gateway = BY_KEY[key]
    argv, env, cwd = command(gateway, _launch_with(python), 8123, URLS, tmp_path)
    router = ROUTERS[ROUTER_KEYS[key]]
    assert gateway.kind == router.kind and gateway in GATEWAYS  # run by default
    assert argv[:3] == [str(python), "-m", router.module]
    assert _value(argv, "--host") == "127.0.0.1" and _value(argv, "--port") == "8123"
    start = argv.index("--worker-urls") + 1
    assert argv[start:start + len(URLS)] == URLS
    assert _value(argv, "--policy") == ("round_robin" if key.endswith("-rr") else "cache_aware")
    metrics = int(_value(argv, "--prometheus-port"))
    assert metrics not in (8123, 29000) and 0 < metrics < 65536  # never a fixed default
    assert _value(argv, "--prometheus-host") == "127.0.0.1"
    assert env == {"PYTHONPATH": ""} and cwd == tmp_path  # nothing of ridge on its path


def test_the_new_routers_are_pinned_and_labelled() -> None:
    assert SMG.startswith("smg==1.13.") and VLLM_ROUTER == "vllm-router==0.1.17"
    assert ROUTERS["smg"].distribution == "smg" and ROUTERS["vllm-router"].version == "0.1.17"
    assert BY_KEY["smg-rr"].label == f"smg {SMG.split('==')[1]}, round robin"
    assert BY_KEY["smg-ca"].label.endswith(", cache_aware")
    assert BY_KEY["vllm-rr"].label == "vLLM router 0.1.17, round robin"
    assert BY_KEY["vllm-ca"].label == "vLLM router 0.1.17, cache_aware"
    assert BY_KEY["sglang-rr"].label == "SGLang router 0.3.2, round robin"  # as before


@pytest.mark.parametrize("kind", ["smg", "vllm-router"])
def test_a_router_without_its_interpreter_is_refused(kind: str, tmp_path: Path) -> None:
    key = next(k for k, v in ROUTER_KEYS.items() if v == kind)
    with pytest.raises(RuntimeError, match=f"{ROUTERS[kind].requirement}.*not installed"):
        command(BY_KEY[key], Launch(sglang_python=tmp_path / "python"), 7, URLS, tmp_path)


def test_the_install_plan_creates_the_venv_once_and_installs_only_the_pin(
        tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    for router in ROUTERS.values():
        create, install = install_plan(router, venv)
        assert create == [sys.executable, "-m", "venv", str(venv)]
        assert install == [str(python), "-m", "pip", "install", "-q", router.requirement]
    python.parent.mkdir(parents=True)
    python.touch()
    assert install_plan(ROUTERS["smg"], venv) == [
        [str(python), "-m", "pip", "install", "-q", SMG]]
    assert BENCH_VENV.name == ".bench-venv"  # never ridge's .venv


def test_the_import_check_names_the_module_and_the_pinned_version() -> None:
    for router in ROUTERS.values():
        check = import_check(router)
        compile(check, "<check>", "exec")
        assert f"import importlib.metadata as m, {router.module};" in check
        assert repr(router.distribution) in check and repr(router.version) in check


def _fake_python(path: Path, rc: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\nexit {rc}\n")
    path.chmod(0o755)
    return path


def test_no_install_is_honoured_and_an_installed_router_is_used(tmp_path: Path) -> None:
    log = tmp_path / "install.log"
    assert router_python(ROUTERS["smg"], False, log, tmp_path / "none") == (
        None, "not installed in none/ (and --no-install)")
    assert not log.exists()  # nothing was tried
    python = _fake_python(tmp_path / "ok" / "bin" / "python", 0)  # its check passes
    assert router_python(ROUTERS["vllm-router"], False, log, tmp_path / "ok") == (python, "")


def test_a_failed_install_says_so(tmp_path: Path) -> None:
    _fake_python(tmp_path / "bad" / "bin" / "python", 1)  # check and pip both fail
    python, why = router_python(ROUTERS["smg"], True, tmp_path / "install.log", tmp_path / "bad")
    assert python is None and why == f"cannot install {SMG} (see install.log)"


def test_the_alias_url_names_the_same_endpoint_otherwise() -> None:
    assert alias_url("http://127.0.0.1:8001") == "http://localhost:8001"
    assert alias_url("http://127.0.0.1:8001/") == "http://localhost:8001"
    assert smg_worker(URLS[0]) == {"url": f"http://localhost:{19000}",
                                   "models": [{"id": PACED_MODEL}]}
    with pytest.raises(ValueError, match="127.0.0.1"):
        alias_url("http://10.0.0.1:8001")


def test_serving_counts_ready_smg_workers_and_healthy_others() -> None:
    smg = {"workers": [{"url": "a", "status": "ready", "is_healthy": True},
                       {"url": "b", "status": "pending", "is_healthy": True}]}
    others = {"workers": [{"url": "a", "is_healthy": True}, {"url": "b", "is_healthy": False}],
              "total": 2}
    assert serving(smg) == 1 and serving(others) == 1 and serving({}) == 0


class FakeSmg:
    """smg's HTTP surface as :func:`router_ready` sees it: the command line's workers serve
    ``MODEL``, ``POST /workers`` adds one, a chat completion is 200 for a served model only."""

    def __init__(self, urls: list[str]) -> None:
        self.workers = [{"url": u, "model_id": MODEL, "status": "ready"} for u in urls]
        self.posted: list[dict[str, Any]] = []

    async def add(self, request: web.Request) -> web.Response:
        spec = await request.json()
        self.posted.append(spec)
        self.workers.append({"url": spec["url"], "model_id": spec["models"][0]["id"],
                             "status": "ready"})
        return web.json_response({"status": "accepted"}, status=202)

    async def listing(self, request: web.Request) -> web.Response:
        return web.json_response({"workers": self.workers, "total": len(self.workers)})

    async def chat(self, request: web.Request) -> web.Response:
        model = (await request.json())["model"]
        served = any(w["model_id"] == model for w in self.workers)
        return web.json_response({}, status=200 if served else 404)


async def test_smg_is_ready_once_the_paced_models_workers_serve() -> None:
    fake = FakeSmg(URLS)
    app = web.Application()
    app.router.add_post("/workers", fake.add)
    app.router.add_get("/workers", fake.listing)
    app.router.add_post("/v1/chat/completions", fake.chat)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    child = cast(Child, SimpleNamespace(url=f"http://127.0.0.1:{runner.addresses[0][1]}",
                                        proc=SimpleNamespace(returncode=None)))
    try:
        assert not await ready(child, 0.5, PACED_MODEL)  # smg refuses an unknown model
        assert await router_ready(child, "vllm-router", URLS, 5.0)  # nothing to add
        assert await router_ready(child, "smg", URLS, 5.0, smg_alias=None)  # a fleet's one model
        assert fake.posted == []
        assert await router_ready(child, "smg", URLS, 5.0)
        assert fake.posted == [smg_worker(u) for u in URLS]
        assert await ready(child, 1.0, PACED_MODEL)
        for worker in fake.workers[1:]:
            worker["status"] = "pending"
        assert not await router_ready(child, "sglang", URLS, 0.3)  # 1 of 8 serving
    finally:
        await runner.cleanup()
