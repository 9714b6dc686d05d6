"""Redis at start-up against a REAL redis-server that requires a password, and against a port
nothing listens on.

- What redis-py raises, pinned: ``AuthenticationError`` for a wrong password and for none
  (the check calls both "credentials refused"), ``ConnectionError`` from a refused
  connection ("unreachable").
- ``ridge serve`` (the installed entry point, as a process) with a wrong password: one line
  says the credentials were refused, the password appears nowhere in its output, requests are
  served on local state, and once Redis accepts that password the state is shared again.
- With ``RIDGE_STATE__REDIS_REQUIRED=true``: a wrong password or an unreachable Redis makes
  ``ridge serve`` exit with status 2 and the message on stderr, without a traceback (one
  process and ``--workers 2``); the right password starts it.

Every wait is bounded (start-up 60 s, a log line 30 s) and none is tight.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis
from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.state.redis import RedisCheck, check_url
from tests.integration.redis_server import RedisServer, running_redis
from tests.real_engine.servers import (
    ROOT,
    Server,
    free_port,
    ridge_binary,
    spawn,
    start_ridge,
    stop_all,
    wait_ready,
    write_fleet,
)

MODEL = "llama-3-8b"
FACTS = {"params": 8.03e9, "layers": 32, "hidden_size": 4096, "kv_heads": 8, "head_dim": 128,
         "dtype_bytes": 2, "max_context": 16384}
L4 = {"name": "l4", "peak_flops": 121e12, "mem_bandwidth": 300e9}
SECRET = "s3cret-of-the-server"
WRONG = "wrong-pw-91f7c2"  # distinctive: searched for in every output


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    """A redis-server requiring the password :data:`SECRET` (set once it runs)."""
    with running_redis() as server:
        admin = SyncRedis(host="127.0.0.1", port=server.port)
        admin.config_set("requirepass", SECRET)
        admin.close()
        yield server


def _url(server: RedisServer, password: str | None) -> str:
    return f"redis://:{password}@127.0.0.1:{server.port}/0" if password else server.url


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fleet file of one simulated engine, which runs for the module."""
    tmp = tmp_path_factory.mktemp("redis-startup")
    port = free_port()
    path = write_fleet({"pools": [{
        "name": "main", "engine": "vllm", "models": [MODEL], "model": FACTS, "hardware": L4,
        "endpoints": [f"http://127.0.0.1:{port}"]}]}, tmp / "fleet.yaml")
    sim = spawn("sim", [sys.executable, "-m", "backends.sim", "--config", str(path),
                        "--speed", "5"], dict(os.environ), tmp, f"http://127.0.0.1:{port}")
    try:
        wait_ready([sim], "/health", 30.0)
        yield path
    finally:
        stop_all([sim])


def _refused_start(fleet: Path, redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``ridge serve`` with Redis required; it is expected to end by itself."""
    env = {**os.environ, "RIDGE_REDIS_URL": redis_url, "RIDGE_STATE__REDIS_REQUIRED": "true",
           "RIDGE_DRAIN_S": "0"}
    argv = [str(ridge_binary()), "serve", "--config", str(fleet), "--host", "127.0.0.1",
            "--port", str(free_port()), *args]
    return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, check=False)


def _wait_for_line(server: Server, text: str, timeout_s: float = 30.0) -> str:
    """The server's log once it holds ``text`` (fails after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        log = server.log_path.read_text(errors="replace")
        if text in log:
            return log
        time.sleep(0.2)
    pytest.fail(f"{text!r} not logged within {timeout_s:.0f} s:\n{server.log_tail()}")


def _chat(server: Server) -> int:
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30).status_code


# --- what redis-py raises, and how the check reads it -----------------------------------

async def test_redis_py_raises_authentication_error_for_a_wrong_password_and_for_none(
        redis: RedisServer) -> None:
    for url in (_url(redis, WRONG), _url(redis, None)):
        client = Redis.from_url(url)
        with pytest.raises(AuthenticationError):
            await client.ping()
        await client.aclose()


async def test_the_check_names_each_outcome(redis: RedisServer) -> None:
    where = f"127.0.0.1:{redis.port}/0"
    assert await check_url(_url(redis, SECRET)) == RedisCheck(where, "ok")
    assert await check_url(_url(redis, WRONG)) == RedisCheck(where, "auth",
                                                             "wrong password or user")
    assert await check_url(_url(redis, None)) == RedisCheck(
        where, "auth", "no password given; it requires one")
    nothing = free_port()
    client = Redis(port=nothing)
    with pytest.raises(RedisConnectionError):
        await client.ping()
    await client.aclose()
    assert await check_url(f"redis://:{WRONG}@127.0.0.1:{nothing}/0") == RedisCheck(
        f"127.0.0.1:{nothing}/0", "unreachable", "connection refused")


# --- ridge serve ------------------------------------------------------------------------

def test_a_wrong_password_is_reported_and_ridge_serves_on_local_state_until_it_is_accepted(
        redis: RedisServer, fleet: Path, tmp_path: Path) -> None:
    env = {"RIDGE_REDIS_URL": _url(redis, WRONG), "RIDGE_STATE__REDIS_PROBE_INTERVAL_S": "0.2"}
    server = start_ridge(fleet, tmp_path, "ridge-wrong-password", env)
    try:
        assert _chat(server) == 200
        admin = SyncRedis(host="127.0.0.1", port=redis.port, password=SECRET)
        admin.config_set("requirepass", WRONG)  # Redis now accepts what ridge sends
        admin.close()
        log = _wait_for_line(server, "Redis answers again")
        assert _chat(server) == 200
    finally:
        server.stop()
    line = (f"ERROR ridge.state: Redis at 127.0.0.1:{redis.port}/0 refused the credentials "
            "(wrong password or user); serving with local state until it accepts them")
    assert log.count(line) == 1, log
    assert WRONG not in log and "redis://" not in log


def test_required_redis_refusing_the_credentials_stops_the_start(
        redis: RedisServer, fleet: Path) -> None:
    done = _refused_start(fleet, _url(redis, WRONG))
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert done.stderr.splitlines()[-1] == (
        f"ridge: Redis at 127.0.0.1:{redis.port}/0 refused the credentials (wrong password or "
        "user); RIDGE_STATE__REDIS_REQUIRED is set, so ridge does not start without it")
    assert "Traceback" not in output and WRONG not in output


@pytest.mark.parametrize("args", [(), ("--workers", "2")], ids=["one-process", "workers"])
def test_required_redis_unreachable_stops_the_start(fleet: Path, args: tuple[str, ...]) -> None:
    nothing = free_port()
    done = _refused_start(fleet, f"redis://:{WRONG}@127.0.0.1:{nothing}/0", *args)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert done.stderr.splitlines()[-1] == (
        f"ridge: Redis at 127.0.0.1:{nothing}/0 unreachable (connection refused); "
        "RIDGE_STATE__REDIS_REQUIRED is set, so ridge does not start without it")
    assert "Traceback" not in output and WRONG not in output


def test_unreachable_redis_is_reported_and_ridge_serves_on_local_state(
        fleet: Path, tmp_path: Path) -> None:
    nothing = free_port()
    env = {"RIDGE_REDIS_URL": f"redis://127.0.0.1:{nothing}/0"}
    server = start_ridge(fleet, tmp_path, "ridge-unreachable", env)
    try:
        assert _chat(server) == 200
    finally:
        server.stop()
    log = server.log_path.read_text(errors="replace")
    assert log.count(f"WARNING ridge.state: Redis at 127.0.0.1:{nothing}/0 unreachable "
                     "(connection refused); serving with local state until it answers") == 1, log


def test_required_redis_that_accepts_the_credentials_starts(
        redis: RedisServer, fleet: Path, tmp_path: Path) -> None:
    env = {"RIDGE_REDIS_URL": _url(redis, SECRET), "RIDGE_STATE__REDIS_REQUIRED": "true"}
    server = start_ridge(fleet, tmp_path, "ridge-required", env)
    try:
        assert _chat(server) == 200
    finally:
        server.stop()
    log = server.log_path.read_text(errors="replace")
    assert f"router state shared in Redis at 127.0.0.1:{redis.port}/0" in log, log
    assert SECRET not in log
