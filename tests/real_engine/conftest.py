"""Fixtures of the real-engine tier: two real vLLM servers and ridge in front of them.

- ``engines`` (package scope: the whole tier): "plain" (prefix caching + chunked prefill,
  512-token chunks) and "spec" (n-gram speculative decoding, K = 4), both SmolLM2-135M in
  float32 with ``--enforce-eager``, started at the same time from ``.engines`` (built by
  ``deploy/vllm-cpu/setup.sh``), each pinned to its own CPU core, warmed up with one request,
  stopped at the end whatever happened. plain answers to ``smollm2-135m`` and
  ``smollm2-135m-plain``, spec to ``smollm2-135m`` and ``smollm2-135m-spec``, so a request's
  model picks one pool or lets ridge choose.
- ``ridge`` (package): ``ridge serve`` as a subprocess over a fleet file of those two pools.
- ``client`` / ``async_client``: official ``openai`` clients pointed at ridge.

A missing ``.engines`` FAILS the tier (with the command to run), it never skips it. Tests
marked ``kills_engine`` kill the spec engine, so they are moved to the end of the tier.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from openai import AsyncOpenAI, OpenAI

from config.fleet import Fleet
from tests.real_engine.prompts import CAPITAL_QUESTION, user
from tests.real_engine.servers import (
    MissingEngines,
    Server,
    StartupError,
    engine_paths,
    free_port,
    pool_entry,
    real_fleet,
    start_ridge,
    start_vllm_pools,
    stop_all,
    write_fleet,
)

T = TypeVar("T")
MODEL = "smollm2-135m"
PLAIN_MODEL = "smollm2-135m-plain"
SPEC_MODEL = "smollm2-135m-spec"
PLAIN_LEVERS = {"prefix_caching": True, "chunked_prefill": {"token_budget": 512}}
SPEC_LEVERS = {"speculative": {"method": "ngram", "num_draft_tokens": 4}}
ENGINE_START_TIMEOUT_S = 240.0
RIDGE_ENV = {"RIDGE_REGISTRY__POLL_INTERVAL_S": "0.5", "RIDGE_LOG_LEVEL": "warning"}


@dataclass(frozen=True)
class Engines:
    """The tier's two engines and the fleet (validated and raw) that describes them."""

    plain: Server
    spec: Server
    fleet: Fleet
    raw: dict[str, Any]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kills_engine: kills an engine; runs last in its tier")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Keep the order, except that this tier's tests which kill an engine go right after its
    other tests (so the package-scoped engines are started once and stopped with the tier)."""
    here = Path(__file__).parent
    ours = [i for i in items if here in i.path.parents]
    killers = [i for i in ours if i.get_closest_marker("kills_engine") is not None]
    if not killers:
        return
    rest = [i for i in items if i not in killers]
    others = [i for i in ours if i not in killers]
    at = rest.index(others[-1]) + 1 if others else len(rest)
    items[:] = rest[:at] + killers + rest[at:]


@pytest.fixture(scope="package")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Server logs and fleet files of this run (printed when a server fails to start)."""
    return tmp_path_factory.mktemp("real-engine-logs")


@pytest.fixture(scope="package")
def engines(log_dir: Path) -> Iterator[Engines]:
    paths = _or_fail(engine_paths)
    fleet, raw = real_fleet([
        pool_entry("plain", [MODEL, PLAIN_MODEL], [free_port()], PLAIN_LEVERS),
        pool_entry("spec", [MODEL, SPEC_MODEL], [free_port()], SPEC_LEVERS),
    ])  # fmt: skip
    started = time.monotonic()
    servers = _or_fail(lambda: start_vllm_pools(fleet.pools, paths, log_dir, ["0", "1"],
                                                ENGINE_START_TIMEOUT_S))
    try:
        healthy = time.monotonic() - started
        for server in servers:
            _warm_up(server.url)
        print(f"\nvLLM plain + spec healthy in {healthy:.1f} s, warmed up in "
              f"{time.monotonic() - started - healthy:.1f} s (logs in {log_dir})")
        yield Engines(servers[0], servers[1], fleet, raw)
    finally:
        stop_all(servers)


def _warm_up(url: str) -> None:
    """The first request of a fresh engine is several times slower; pay it here."""
    with OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120) as client:
        client.chat.completions.create(model=MODEL, messages=user(CAPITAL_QUESTION),
                                       max_tokens=8, temperature=0)


def ridge_over(raw: dict[str, Any], log_dir: Path, name: str,
               env: dict[str, str]) -> Server:
    """ridge as a subprocess over the fleet ``raw``; fails the test if it does not get ready."""
    fleet_file = write_fleet(raw, log_dir / f"{name}-fleet.yaml")
    return _or_fail(lambda: start_ridge(fleet_file, log_dir, name=name, env=env))


def _or_fail(start: Callable[[], T]) -> T:
    """``start()``, or a test failure carrying only the reason (and any server log tail)."""
    try:
        return start()
    except (MissingEngines, StartupError) as exc:
        reason = f"{type(exc).__name__}: {exc}"
    pytest.fail(reason, pytrace=False)


@pytest.fixture(scope="package")
def ridge(engines: Engines, log_dir: Path) -> Iterator[Server]:
    started = time.monotonic()
    server = ridge_over(engines.raw, log_dir, "ridge", RIDGE_ENV)
    print(f"\nridge ready in {time.monotonic() - started:.1f} s")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="package")
def client(ridge: Server) -> Iterator[OpenAI]:
    with OpenAI(base_url=ridge.url + "/v1", api_key="unused", max_retries=0,
                timeout=60) as c:
        yield c


@pytest.fixture
async def async_client(ridge: Server) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=ridge.url + "/v1", api_key="unused", max_retries=0,
                           timeout=60) as c:
        yield c
