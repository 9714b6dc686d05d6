"""Embeddings through ridge from the real vLLM CPU build: SmolLM2-135M served as an embedding
model (vLLM's pooling runner, ``--runner pooling --convert embed`` through the pool's
``engine_args``), reached by the official ``openai`` client's ``embeddings.create`` through
ridge, and the vectors equal to the engine's own answer.

This module starts its own single engine and stops it at the end; it sorts before the tier's
shared engines start (as ``test_demo_real.py`` does), so at most two engines are ever up.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from backends.vllm_launch import vllm_command, vllm_env
from tests.real_engine.servers import (
    MissingEngines,
    Server,
    StartupError,
    engine_paths,
    free_port,
    pool_entry,
    real_fleet,
    spawn,
    start_ridge,
    stop_all,
    wait_ready,
    write_fleet,
)

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(600)]

MODEL = "smollm2-135m"
HIDDEN = 576  # SmolLM2-135M's hidden size: the embedding's length
START_TIMEOUT_S = 300.0
TEXTS = ["The capital of France is Paris.", "Bonjour"]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:
    """One vLLM engine running the pooling runner, and ridge in front of it: (engine, ridge)."""
    try:
        paths = engine_paths()
    except MissingEngines as exc:
        pytest.fail(str(exc), pytrace=False)
    logs = tmp_path_factory.mktemp("embed-logs")
    port = free_port()
    entry = pool_entry("embed", [MODEL], [port], {})
    entry["engine_args"] = ["--runner", "pooling", "--convert", "embed"]
    fleet, raw = real_fleet([entry])
    argv = vllm_command(str(paths.python), fleet.pools[0], port, str(paths.model_dir))
    started = time.monotonic()
    engine = spawn("vllm-embed", argv, vllm_env(os.environ, kv_cache_gib=1), logs,
                   f"http://127.0.0.1:{port}")
    servers = [engine]
    try:
        wait_ready([engine], "/health", START_TIMEOUT_S)
        print(f"\nvLLM pooling runner healthy in {time.monotonic() - started:.1f} s")
        servers.append(start_ridge(write_fleet(raw, logs / "fleet.yaml"), logs,
                                   env={"RIDGE_REGISTRY__POLL_INTERVAL_S": "0.5"}))
        yield engine, servers[1]
    except StartupError as exc:
        pytest.fail(f"StartupError: {exc}", pytrace=False)
    finally:
        stop_all(servers)
        print(f"\nthe embeddings module took {time.monotonic() - started:.1f} s")


def test_embeddings_through_ridge_are_the_engines(served: tuple[Server, Server]) -> None:
    engine, ridge = served
    with openai.OpenAI(base_url=ridge.url + "/v1", api_key="unused", max_retries=0,
                       timeout=120) as client:
        reply = client.embeddings.create(model=MODEL, input=TEXTS)
    assert reply.model == MODEL and [d.index for d in reply.data] == [0, 1]
    vectors = [d.embedding for d in reply.data]
    assert all(len(v) == HIDDEN for v in vectors)
    assert all(math.isclose(math.hypot(*v), 1.0, rel_tol=1e-3) for v in vectors)  # normalised
    direct = httpx.post(engine.url + "/v1/embeddings", timeout=120,
                        json={"model": MODEL, "input": TEXTS}).json()
    for mine, own in zip(vectors, [d["embedding"] for d in direct["data"]], strict=True):
        assert mine == pytest.approx(own, abs=1e-6)  # the same request, the same vector
    assert reply.usage.prompt_tokens == direct["usage"]["prompt_tokens"] > 0
