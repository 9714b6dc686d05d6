"""A property-based fuzz of the OpenAI request bodies: whatever a client sends to the generation
routes, ridge itself never answers 5xx.

ridge (``ridge serve``) runs in front of one simulated vLLM engine (``backends.sim``), both
real processes. Hypothesis builds requests from five families — valid chat and completions
bodies (every optional field ridge reads drawn from valid values, plus an arbitrary extra
field), the same with one field ridge reads (``model``, ``messages``, ``prompt``, ``stream``,
``stream_options``, ``max_tokens``, ``max_completion_tokens``, ``user``) replaced by any JSON
value, and arbitrary JSON values or bytes — and posts each to its path. The property: the
status is below 500 and a non-streamed answer is a JSON object. Bounded: ``MAX_EXAMPLES``
bodies, each answered within ``WAIT_S`` (the engine runs 1000× faster than the hardware it
simulates, and valid bodies ask for at most 16 tokens: a body without ``max_tokens`` makes the
engine generate up to its context, 4,096 tokens).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fakes.harness import free_ports
from tests.real_engine.servers import Server, spawn, start_ridge, stop_all, wait_ready, write_fleet

MODEL = "llama-3-8b"
MAX_EXAMPLES = 250
WAIT_S = 60.0
FACTS = {"params": 8.03e9, "layers": 32, "hidden_size": 4096, "kv_heads": 8, "head_dim": 128,
         "dtype_bytes": 2, "max_context": 4096}
L4 = {"name": "l4", "peak_flops": 121e12, "mem_bandwidth": 300e9}
PATHS = ("/v1/chat/completions", "/v1/completions")


@pytest.fixture(scope="module")
def ridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("fuzz")
    port = free_ports(1)[0]
    fleet = write_fleet({"pools": [{
        "name": "main", "engine": "vllm", "models": [MODEL], "model": FACTS, "hardware": L4,
        "endpoints": [f"http://127.0.0.1:{port}"]}]}, tmp / "fleet.yaml")
    sim = spawn("sim", [sys.executable, "-m", "backends.sim", "--config", str(fleet),
                        "--speed", "1000"], dict(os.environ), tmp, f"http://127.0.0.1:{port}")
    servers = [sim]
    try:
        wait_ready([sim], "/health", 30.0)
        servers.append(start_ridge(fleet, tmp, "ridge"))
        yield servers[1]
    finally:
        stop_all(servers)


# -- the bodies ----------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=50),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=30)
small_ints = st.integers(min_value=1, max_value=16)
anything = json_values | st.text(max_size=20)
text_parts = st.lists(st.fixed_dictionaries({"type": st.just("text"),
                                             "text": st.text(max_size=80)}), max_size=3)
valid_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant"]),
     "content": st.text(max_size=300) | text_parts},
    optional={"name": st.text(max_size=10)})
valid_prompt = (st.text(max_size=300) | st.lists(st.text(max_size=50), min_size=1, max_size=4)
                | st.lists(st.integers(min_value=0, max_value=30_000), min_size=1, max_size=40))
options = {"stream": st.booleans(),
           "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
           "max_completion_tokens": small_ints,
           "user": st.text(max_size=40), "temperature": st.floats(min_value=0, max_value=2),
           "extra": json_values}
valid_chat = st.fixed_dictionaries(
    {"model": st.just(MODEL), "messages": st.lists(valid_message, min_size=1, max_size=4),
     "max_tokens": small_ints}, optional=options)
valid_completion = st.fixed_dictionaries(
    {"model": st.just(MODEL), "prompt": valid_prompt, "max_tokens": small_ints},
    optional=options)
FIELDS = ("model", "messages", "prompt", "stream", "stream_options", "max_tokens",
          "max_completion_tokens", "user")


def perturbed(valid: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """A valid body with one field ridge reads replaced by any JSON value."""
    return st.tuples(valid, st.sampled_from(FIELDS), anything).map(
        lambda t: {**t[0], t[1]: t[2]})


def encoded(bodies: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    return bodies.map(lambda v: json.dumps(v).encode())


CHAT, COMPLETIONS = PATHS
requests = st.one_of(
    st.tuples(st.just(CHAT), encoded(valid_chat)),
    st.tuples(st.just(COMPLETIONS), encoded(valid_completion)),
    st.tuples(st.just(CHAT), encoded(perturbed(valid_chat))),
    st.tuples(st.just(COMPLETIONS), encoded(perturbed(valid_completion))),
    st.tuples(st.sampled_from(PATHS), encoded(json_values) | st.binary(max_size=300)),
)


@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(request=requests)
def test_no_body_makes_ridge_answer_5xx(ridge: Server, request: tuple[str, bytes]) -> None:
    path, body = request
    with httpx.Client(timeout=WAIT_S) as client:
        response = client.post(ridge.url + path, content=body,
                               headers={"content-type": "application/json"})
    assert response.status_code < 500, (response.status_code, response.text[:500], body[:500])
    if "text/event-stream" not in response.headers.get("content-type", ""):
        answer: Any = response.json()
        assert isinstance(answer, dict)
