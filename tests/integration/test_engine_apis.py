"""The rest of the OpenAI-compatible surface through ridge, against the simulator: one model,
embeddings, the Responses API (plain and streamed), tokenize / detokenize, score, rerank,
ridge's version, and the 404 / 405 answers of what ridge does not route — with the official
``openai`` client where it has the call, plain HTTP elsewhere."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio

from backends.sim import start_fleet
from backends.sim.pooling import EMBEDDING_DIMS
from config.fleet import parse_fleet
from gateway.access.keys import KeyLimits, KeysFile, make_record, new_key
from gateway.server.routes import ridge_version
from tests.fakes.harness import RunningRidge, free_ports, quick_settings, running_ridge

CHAT, EMBED, SG = "chat-m", "embed-m", "sg-m"
FACTS = {"params": 1.35e8, "layers": 30, "hidden_size": 576, "kv_heads": 3, "head_dim": 64,
         "dtype_bytes": 2, "max_context": 4096}
HARDWARE = {"name": "l4", "peak_flops": 121e12, "mem_bandwidth": 300e9}
EVERY_KEY, CHAT_KEY, ADMIN_KEY = new_key(), new_key(), new_key()


def _pool(name: str, engine: str, model: str, ports: list[int]) -> dict[str, Any]:
    return {"name": name, "engine": engine, "models": [model], "model": FACTS,
            "hardware": HARDWARE, "endpoints": [f"http://127.0.0.1:{p}" for p in ports]}


@pytest_asyncio.fixture(scope="module")
async def ridge(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningRidge]:
    """ridge with two keys (one for every model, rate-limited; one for the chat model only)
    over a simulated fleet: two vLLM engines for the chat model, one for the embedding
    model, one SGLang engine."""
    keys = tmp_path_factory.mktemp("keys") / "keys.json"
    KeysFile(keys).write([
        make_record(EVERY_KEY, "every", limits=KeyLimits(rpm=10_000, tpm=10_000_000)),
        make_record(CHAT_KEY, "chat", models=[CHAT]),
        make_record(ADMIN_KEY, "admin", admin=True),
    ])
    p = free_ports(4)
    fleet = parse_fleet({"pools": [
        _pool("chat", "vllm", CHAT, p[0:2]), _pool("embed", "vllm", EMBED, p[2:3]),
        _pool("sg", "sglang", SG, p[3:4])]})
    sim = await start_fleet(fleet, speed=50.0, seed=3)
    try:
        async with running_ridge(fleet, quick_settings(keys_file=str(Path(keys)))) as running:
            yield running
    finally:
        await sim.stop()


def _client(ridge: RunningRidge, key: str = EVERY_KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=ridge.url + "/v1", api_key=key, max_retries=0,
                              timeout=30)


def _http(ridge: RunningRidge, key: str = EVERY_KEY) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=ridge.url, timeout=30,
                             headers={"authorization": f"Bearer {key}"})


async def _metrics(ridge: RunningRidge) -> str:
    async with _http(ridge, ADMIN_KEY) as http:
        return (await http.get("/metrics")).text


# -- models ------------------------------------------------------------------------------------


async def test_one_model_is_retrieved_as_listed(ridge: RunningRidge) -> None:
    async with _client(ridge) as client:
        model = await client.models.retrieve(CHAT)
        listed = {m.id async for m in client.models.list()}
    assert (model.id, model.object, model.owned_by) == (CHAT, "model", "ridge")
    assert listed == {CHAT, EMBED, SG}


async def test_an_unknown_model_is_openais_404(ridge: RunningRidge) -> None:
    async with _client(ridge) as client:
        with pytest.raises(openai.NotFoundError) as info:
            await client.models.retrieve("no-such-model")
    assert info.value.code == "model_not_found" and info.value.param == "model"


async def test_a_key_sees_only_its_models(ridge: RunningRidge) -> None:
    async with _client(ridge, CHAT_KEY) as client:
        assert (await client.models.retrieve(CHAT)).id == CHAT
        assert [m.id async for m in client.models.list()] == [CHAT]
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve(EMBED)
        with pytest.raises(openai.NotFoundError) as info:
            await client.embeddings.create(model=EMBED, input="x")
    assert info.value.code == "model_not_found"
    async with _client(ridge, "rk-not-a-key") as client:
        with pytest.raises(openai.AuthenticationError):
            await client.models.retrieve(CHAT)


# -- embeddings --------------------------------------------------------------------------------


async def test_embeddings_through_the_client(ridge: RunningRidge) -> None:
    texts = ["the cat sat on the mat", "a completely different sentence"]
    async with _client(ridge) as client:
        raw = await client.embeddings.with_raw_response.create(model=EMBED, input=texts)
        again = await client.embeddings.create(model=EMBED, input=texts[0],
                                               encoding_format="float")
    reply = raw.parse()  # the client asks for base64 by default and decodes it
    vectors = [d.embedding for d in reply.data]
    assert [len(v) for v in vectors] == [EMBEDDING_DIMS] * 2
    assert all(abs(math.fsum(x * x for x in v) - 1.0) < 1e-4 for v in vectors)
    assert vectors[0] != vectors[1]
    assert again.data[0].embedding == pytest.approx(vectors[0], abs=1e-6)  # float32 round trip
    assert reply.usage.prompt_tokens == sum(-(-len(t) // 4) for t in texts)
    assert raw.headers["x-request-id"].startswith("req-")
    assert "reason=only_pool" in raw.headers["x-ridge-route"]
    assert raw.headers["x-ratelimit-limit-requests"] == "10000"


async def test_embeddings_are_counted_like_generation(ridge: RunningRidge) -> None:
    async with _client(ridge) as client:
        await client.embeddings.create(model=EMBED, input="count me")
    text = await _metrics(ridge)
    assert _value(text, "ridge_requests_total", model=EMBED, pool="embed", status="200") >= 1
    assert _value(text, "ridge_prompt_tokens_total", model=EMBED, pool="embed",
                  lever="none") >= 2


@pytest.mark.parametrize(("body", "param"), [
    ({"model": EMBED}, "input"),
    ({"model": EMBED, "input": []}, "input"),
    ({"input": "x"}, "model"),
])
async def test_bad_embeddings_requests_are_named_400s(ridge: RunningRidge, body: dict[str, Any],
                                                      param: str) -> None:
    async with _http(ridge) as http:
        reply = await http.post("/v1/embeddings", json=body)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param
    assert reply.headers["x-request-id"]


async def test_a_model_no_pool_serves_is_a_404(ridge: RunningRidge) -> None:
    async with _client(ridge) as client:
        with pytest.raises(openai.NotFoundError) as info:
            await client.embeddings.create(model="nobody-serves-this", input="x")
    assert info.value.code == "model_not_found"


# -- the Responses API -------------------------------------------------------------------------


async def test_responses_plain(ridge: RunningRidge) -> None:
    async with _client(ridge) as client:
        raw = await client.responses.with_raw_response.create(
            model=CHAT, instructions="Be brief.", input="Say something.", max_output_tokens=8)
    reply = raw.parse()
    assert reply.status == "incomplete" and reply.output_text  # it ran to max_output_tokens
    assert reply.usage is not None and reply.usage.output_tokens == 8
    assert reply.usage.total_tokens == reply.usage.input_tokens + 8
    assert raw.headers["x-ridge-route"].startswith("pool=chat")


async def test_responses_stream_is_relayed_event_for_event(ridge: RunningRidge) -> None:
    before = _value(await _metrics(ridge),
                    "ridge_time_to_first_token_seconds_count", model=CHAT, pool="chat",
                    lever="none")
    async with _client(ridge) as client:
        stream = await client.responses.create(
            model=CHAT, input=[{"role": "user", "content": [
                {"type": "input_text", "text": "Tell me a story."}]}],
            max_output_tokens=12, stream=True)
        events = [event async for event in stream]
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1 and [e.sequence_number for e in events] == list(range(len(events)))
    done = events[-1].response  # type: ignore[union-attr]
    assert done.output_text == "".join(deltas) and done.usage is not None
    text = await _metrics(ridge)
    assert _value(text, "ridge_time_to_first_token_seconds_count", model=CHAT, pool="chat",
                  lever="none") == before + 1  # the first delta was found
    assert _value(text, "ridge_completion_tokens_total", model=CHAT, pool="chat",
                  lever="none") >= done.usage.output_tokens


async def test_responses_stream_bytes_are_the_engines(ridge: RunningRidge) -> None:
    body = {"model": CHAT, "input": "Hello.", "max_output_tokens": 4, "stream": True}
    async with _http(ridge) as http, http.stream("POST", "/v1/responses", json=body) as reply:
        raw = b"".join([chunk async for chunk in reply.aiter_bytes()])
    assert reply.headers["content-type"] == "text/event-stream"
    events = [e for e in raw.split(b"\n\n") if e]
    assert all(e.startswith(b"event: response.") for e in events)
    completed = json.loads(events[-1].split(b"\ndata: ", 1)[1])
    assert completed["type"] == "response.completed"
    assert completed["response"]["usage"]["output_tokens"] == 4


# -- tokenize, detokenize, score, rerank, version --------------------------------------------


async def test_tokenize_and_detokenize(ridge: RunningRidge) -> None:
    prompt = "What is the capital of France?"
    async with _http(ridge) as http:
        tokens = (await http.post("/tokenize", json={"model": CHAT, "prompt": prompt})).json()
        text = (await http.post("/detokenize", json={"model": CHAT,
                                                      "tokens": tokens["tokens"]})).json()
        chat = (await http.post("/tokenize", json={
            "model": CHAT, "messages": [{"role": "user", "content": prompt}]})).json()
        metrics = await _metrics(ridge)
    assert tokens["count"] == len(tokens["tokens"]) == -(-len(prompt) // 4)
    assert tokens["max_model_len"] == FACTS["max_context"]
    assert text == {"prompt": prompt}
    assert chat["count"] > tokens["count"]  # the chat template's tokens
    assert _value(metrics, "ridge_requests_total", model=CHAT, pool="chat", status="200") >= 3


async def test_tokenize_teaches_the_latency_figures_nothing(ridge: RunningRidge) -> None:
    async with _http(ridge) as http:
        before = _value(await _metrics(ridge), "ridge_request_duration_seconds_count",
                        model=SG, pool="sg", lever="none")
        assert (await http.post("/tokenize", json={"model": SG, "prompt": "x"})).status_code \
            == 200
        after = await _metrics(ridge)
    assert _value(after, "ridge_request_duration_seconds_count", model=SG, pool="sg",
                  lever="none") == before
    assert _value(after, "ridge_requests_total", model=SG, pool="sg", status="200") >= 1


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
async def test_score(ridge: RunningRidge, path: str) -> None:
    body = {"model": EMBED, "queries": "capital of France",
            "documents": ["Paris is the capital of France.", "Bananas are yellow."]}
    async with _http(ridge) as http:
        reply = await http.post(path, json=body)
    scores = [d["score"] for d in reply.json()["data"]]
    assert reply.status_code == 200 and scores[0] > scores[1]
    assert reply.headers["x-request-id"]


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
async def test_rerank(ridge: RunningRidge, path: str) -> None:
    body = {"model": EMBED, "query": "capital of France", "top_n": 2,
            "documents": ["Bananas are yellow.", "Paris is the capital of France.", "France."]}
    async with _http(ridge) as http:
        reply = await http.post(path, json=body)
    results = reply.json()["results"]
    assert [r["index"] for r in results] == [1, 2]
    assert results[0]["document"]["text"] == body["documents"][1]


async def test_sglang_answers_its_own_rerank_path_only(ridge: RunningRidge) -> None:
    body = {"model": SG, "query": "q", "documents": ["q"]}
    async with _http(ridge) as http:
        ours = await http.post("/v1/rerank", json=body)
        theirs = await http.post("/rerank", json=body)
    assert ours.status_code == 200
    assert theirs.status_code == 404 and "model_not_found" not in theirs.text  # the engine's


async def test_version_is_ridges_own(ridge: RunningRidge) -> None:
    async with httpx.AsyncClient(base_url=ridge.url) as http:
        reply = await http.get("/version")
    assert reply.status_code == 200 and reply.json() == {"version": ridge_version()}


# -- what ridge does not route -----------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/v1/no/such/route"), ("GET", "/v1/responses/resp_123"), ("POST", "/pooling"),
])
async def test_an_unknown_path_is_openais_404_naming_it(ridge: RunningRidge, method: str,
                                                        path: str) -> None:
    async with _http(ridge) as http:
        reply = await http.request(method, path, json={"model": CHAT})
    error = reply.json()["error"]
    assert reply.status_code == 404 and error["message"] == f"Invalid URL ({method} {path})"
    assert set(error) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("GET", "/v1/embeddings", "POST"), ("GET", "/tokenize", "POST"),
    ("GET", "/v1/responses", "POST"), ("POST", "/version", "GET"),
    ("POST", f"/v1/models/{CHAT}", "GET"),
])
async def test_a_known_path_with_another_method_is_a_405_with_allow(
        ridge: RunningRidge, method: str, path: str, allow: str) -> None:
    async with _http(ridge) as http:
        reply = await http.request(method, path)
    assert reply.status_code == 405 and reply.headers["allow"] == allow
    assert reply.json()["error"]["code"] == "method_not_allowed"


def _value(page: str, name: str, **labels: str) -> float:
    """The sample ``name`` with exactly ``labels`` on a Prometheus page (0 when absent)."""
    want = "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
    for line in page.splitlines():
        if line.startswith(name + want + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
