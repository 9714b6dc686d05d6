"""Embeddings through ridge from the real vLLM CPU build: SmolLM2-135M served as an embedding
model (vLLM's pooling runner, ``--runner pooling --convert embed`` through the pool's
``engine_args``), reached by the official ``openai`` client's ``embeddings.create`` through
ridge, and the vectors equal to the engine's own answer.

This module starts its own single engine and stops it at the end; it sorts before the tier's
shared engines start (as ``test_demo_real.py`` does), so at most two engines are ever up.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.real_engine.servers import (
    MissingEngines,
    Server,
    StartupError,
    free_port,
    one_engine_and_ridge,
    pool_entry,
)

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(600)]

MODEL = "smollm2-135m"
HIDDEN = 576  # SmolLM2-135M's hidden size: the embedding's length
TEXTS = ["The capital of France is Paris.", "Bonjour"]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:
    """One vLLM engine running the pooling runner, and ridge in front of it: (engine, ridge)."""
    entry = pool_entry("embed", [MODEL], [free_port()], {})
    entry["engine_args"] = ["--runner", "pooling", "--convert", "embed"]
    try:
        with one_engine_and_ridge(entry, tmp_path_factory.mktemp("embed-logs")) as served:
            yield served
    except (MissingEngines, StartupError) as exc:
        pytest.fail(f"{type(exc).__name__}: {exc}", pytrace=False)


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
