"""The engine pair's pool, commands and environment, the prefix-cache reset and the health
wait (no engine is started: a fake server on a free port, a process that exits at once)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp import web

from backends.launch.real_fleet import RealFleet
from config.fleet import parse_fleet
from ridge_bench.harness.procs import free_port
from ridge_bench.precise.engines import (
    EVENTS_FLAG,
    LOOPBACK_BIND,
    demo_pool,
    engine_argv,
    engine_env,
    engine_pool,
    loopback_events,
    reset_prefix_caches,
    wait_healthy,
)


def pool_raw(blocks: int = 24) -> dict[str, object]:
    ports = itertools.count(21000)
    return engine_pool(demo_pool(), lambda: next(ports), blocks)


def test_the_pool_is_the_demo_pools_levers_on_two_fresh_endpoints_with_events() -> None:
    raw = pool_raw(20)
    template = demo_pool()
    assert raw["levers"] == template["levers"] and raw["model"] == template["model"]
    assert raw["endpoints"] == ["http://127.0.0.1:21000", "http://127.0.0.1:21001"]
    assert raw["kv_events"]["addresses"] == ["tcp://127.0.0.1:21002", "tcp://127.0.0.1:21003"]
    assert raw["engine_args"] == ["--num-gpu-blocks-override", "20", "--enable-scale-out"]
    pool = parse_fleet({"pools": [raw]}).pools[0]
    assert pool.kv_event_sources()["http://127.0.0.1:21001"].replay == "tcp://127.0.0.1:21005"


def test_the_events_bind_on_loopback_only() -> None:
    argv = ["x", EVENTS_FLAG, json.dumps({"endpoint": "tcp://*:5557",
                                          "replay_endpoint": "tcp://*:5558", "topic": ""}), "y"]
    config = json.loads(loopback_events(argv)[2])
    assert config == {"endpoint": f"{LOOPBACK_BIND}5557", "replay_endpoint": "tcp://127.0.0.1:5558",
                      "topic": ""}
    assert loopback_events(["a", "b"]) == ["a", "b"]


def test_each_engine_gets_its_own_port_and_event_ports() -> None:
    pool = parse_fleet({"pools": [pool_raw()]}).pools[0]
    argv = engine_argv(pool, "http://127.0.0.1:21001", "python", "MODEL")
    assert argv[argv.index("--port") + 1] == "21001"
    config = json.loads(argv[argv.index(EVENTS_FLAG) + 1])
    assert config["endpoint"] == f"{LOOPBACK_BIND}21003"
    assert config["replay_endpoint"] == "tcp://127.0.0.1:21005"
    assert argv[-3:] == ["--num-gpu-blocks-override", "24", "--enable-scale-out"]


def test_the_engine_environment() -> None:
    env = engine_env({"PYTHONPATH": "ridge", "HOME": "h"}, 1)
    assert "PYTHONPATH" not in env and env["HOME"] == "h"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and env["VLLM_SERVER_DEV_MODE"] == "1"


async def fake_engine(answers: list[bool]) -> tuple[web.AppRunner, str, list[int]]:
    """A server whose resets answer ``answers`` in turn (then success); counts the calls."""
    calls = [0]

    async def reset(_: web.Request) -> web.Response:
        calls[0] += 1
        ok = answers.pop(0) if answers else True
        return web.json_response({"success": ok})

    app = web.Application()
    app.router.add_post("/reset_prefix_cache", reset)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}", calls


async def test_a_refused_reset_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ridge_bench.precise.engines.asyncio.sleep", _no_sleep)
    runner, url, calls = await fake_engine([False])
    try:
        await reset_prefix_caches([url])
        assert calls == [2]
    finally:
        await runner.cleanup()


async def test_a_reset_that_never_succeeds_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ridge_bench.precise.engines.asyncio.sleep", _no_sleep)
    runner, url, _ = await fake_engine([False] * 20)
    try:
        with pytest.raises(RuntimeError, match="did not reset"):
            await reset_prefix_caches([url])
    finally:
        await runner.cleanup()


async def test_an_engine_that_exits_ends_the_wait(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("boom\n")
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with pytest.raises(RuntimeError, match="exited during start-up:\nboom"):
        await wait_healthy([f"http://127.0.0.1:{free_port()}"], RealFleet([proc]), [log], 30.0)


async def _no_sleep(_: float) -> None:
    return None
