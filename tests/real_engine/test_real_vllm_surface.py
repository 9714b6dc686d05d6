"""The rest of the OpenAI-compatible surface through ridge against real vLLM: one model, the
Responses API (plain and streamed) and ``/tokenize`` / ``/detokenize``, and ridge's own
``/version``.

The Responses answer must be the chat answer (greedy, same template) and its usage what the
engine counted itself; the stream relayed by ridge must be the engine's event sequence, and
the simulator's shapes (:mod:`backends.sim.responses_shapes`) must have the same events with the
same fields. ``/tokenize`` through ridge must be the engine's answer, and its count the prompt
tokens the engine bills. (Embeddings, score and rerank need a pooling model, which this tier
does not run: the simulator covers them.)
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from backends.sim.responses_shapes import EventStream, Turn, response, usage
from gateway.server.routes import ridge_version
from tests.real_engine.conftest import MODEL, PLAIN_MODEL, SPEC_MODEL, Engines
from tests.real_engine.prompts import CAPITAL_ANSWER, CAPITAL_PROMPT, CAPITAL_QUESTION, user
from tests.real_engine.scrape import delta, poll, totals
from tests.real_engine.servers import Server

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(600)]

ASK = {"model": PLAIN_MODEL, "input": CAPITAL_QUESTION, "max_output_tokens": 32,
       "temperature": 0}


def _engine_tokens(engine: Server, before: dict[str, float]) -> tuple[float, float]:
    """The engine's prompt and generation token counts since ``before``, once settled."""
    seen: list[tuple[float, float]] = []

    def read() -> tuple[float, float]:
        after = totals(engine.url)
        return (delta(before, after, "vllm:prompt_tokens_total"),
                delta(before, after, "vllm:generation_tokens_total"))

    def settled(now: tuple[float, float]) -> bool:
        seen.append(now)
        return len(seen) > 1 and seen[-2] == now and now[1] > 0

    return poll(read, settled, timeout_s=5.0)


def _events(base_url: str, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A Responses stream as (event line's name, data) pairs, read raw."""
    with httpx.stream("POST", base_url + "/v1/responses", json={**body, "stream": True},
                      timeout=60) as reply:
        assert reply.status_code == 200
        raw = b"".join(reply.iter_bytes())
    out = []
    for block in raw.split(b"\n\n"):
        if block.strip():
            head, data = block.split(b"\n", 1)
            out.append((head.removeprefix(b"event: ").decode(),
                        json.loads(data.removeprefix(b"data: "))))
    return out


def _sim_events() -> dict[str, dict[str, Any]]:
    """The simulator's event of each type, by type."""
    stream = EventStream(Turn("resp_1", "msg_1", 0, "m", {}))
    raw = (stream.opening(8) + stream.first_text() + stream.delta("x")
           + stream.closing("x", "stop", 8, usage(1, 1)))
    events = [json.loads(b.split(b"\ndata: ", 1)[1]) for b in raw.split(b"\n\n") if b]
    return {e["type"]: e for e in events}


def test_one_model_is_retrieved(client: OpenAI) -> None:
    for model in (MODEL, PLAIN_MODEL, SPEC_MODEL):
        assert client.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no-such-model")
    assert info.value.code == "model_not_found"


def test_responses_answers_as_chat_does_and_counts_what_the_engine_counted(
        client: OpenAI, engines: Engines) -> None:
    before = totals(engines.plain.url)
    reply = client.responses.create(**ASK)
    assert reply.output_text == CAPITAL_ANSWER and reply.status == "completed"
    assert reply.usage is not None
    assert _engine_tokens(engines.plain, before) == (reply.usage.input_tokens,
                                                     reply.usage.output_tokens)
    chat = client.chat.completions.create(model=PLAIN_MODEL, messages=user(CAPITAL_QUESTION),
                                          max_tokens=32, temperature=0)
    assert chat.usage is not None and chat.usage.prompt_tokens == reply.usage.input_tokens


def test_responses_streams_through_the_client(client: OpenAI, ridge: Server) -> None:
    page = totals(ridge.url)
    stream = client.responses.create(**ASK, stream=True)
    events = list(stream)
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == CAPITAL_ANSWER and len(deltas) > 1
    done = events[-1]
    assert done.type == "response.completed" and done.response.usage is not None
    after = totals(ridge.url)
    assert delta(page, after, "ridge_time_to_first_token_seconds_count") == 1  # a delta found
    assert delta(page, after, "ridge_completion_tokens_total") == done.response.usage.output_tokens


def test_the_relayed_stream_is_the_engines_and_the_simulator_writes_the_same(
        ridge: Server, engines: Engines) -> None:
    relayed = _events(ridge.url, ASK)
    direct = _events(engines.plain.url, ASK)
    assert [(name, list(data)) for name, data in relayed] == [
        (name, list(data)) for name, data in direct]
    assert all(name == data["type"] for name, data in relayed)
    sim = _sim_events()
    for _, data in relayed:  # every event type the engine sent, with the simulator's fields
        assert _shape(sim[data["type"]]) == _shape(data), data["type"]
    real = relayed[-1][1]["response"]
    assert _shape(response(Turn("r", "m", 0, "m", {}), "x", "stop", 8, usage(1, 1))) == \
        _shape(real)


def _shape(value: Any) -> Any:
    """The fields of a JSON value, in order, nested (an array by its first item)."""
    if isinstance(value, dict):
        return [(key, _shape(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return None


def test_tokenize_through_ridge_is_the_engines_and_counts_the_billed_tokens(
        client: OpenAI, ridge: Server, engines: Engines) -> None:
    for body in ({"model": PLAIN_MODEL, "prompt": CAPITAL_PROMPT},
                 {"model": PLAIN_MODEL, "messages": user(CAPITAL_QUESTION)}):
        via = httpx.post(ridge.url + "/tokenize", json=body, timeout=30)
        direct = httpx.post(engines.plain.url + "/tokenize", json=body, timeout=30).json()
        assert via.status_code == 200 and via.json() == direct and direct["count"] > 0
        assert via.headers["x-request-id"]
    billed = client.completions.create(model=PLAIN_MODEL, prompt=CAPITAL_PROMPT, max_tokens=1)
    counted = httpx.post(ridge.url + "/tokenize", json={"model": PLAIN_MODEL,
                                                        "prompt": CAPITAL_PROMPT}).json()
    assert billed.usage is not None and billed.usage.prompt_tokens == counted["count"]
    text = httpx.post(ridge.url + "/detokenize", json={"model": PLAIN_MODEL,
                                                       "tokens": counted["tokens"]}).json()
    assert CAPITAL_QUESTION in text["prompt"]


def test_the_version_is_ridges_and_an_unknown_path_is_named(ridge: Server,
                                                           engines: Engines) -> None:
    assert httpx.get(ridge.url + "/version").json() == {"version": ridge_version()}
    assert httpx.get(engines.plain.url + "/version").json()["version"].startswith("0.32")
    missing = httpx.post(ridge.url + "/v1/nothing", json={})
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "Invalid URL (POST /v1/nothing)"
