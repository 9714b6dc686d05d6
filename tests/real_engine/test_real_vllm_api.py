"""The OpenAI API through ridge against real vLLM: answers, streaming, usage, model list.

A greedy "What is the capital of France?" has one known answer from SmolLM2-135M, through
chat and completions, streamed or not, with the sync and the async client. Token counts that
ridge relays (the usage object and the streamed usage chunk) must equal what the engine
itself counted in its ``vllm:prompt_tokens_total`` / ``vllm:generation_tokens_total``.
"""

from __future__ import annotations

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI

from tests.real_engine.conftest import MODEL, PLAIN_MODEL, SPEC_MODEL, Engines
from tests.real_engine.prompts import CAPITAL_ANSWER, CAPITAL_PROMPT, CAPITAL_QUESTION, user
from tests.real_engine.scrape import delta, poll, totals
from tests.real_engine.servers import Server

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(600)]

PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"


@pytest.mark.parametrize("model", [MODEL, PLAIN_MODEL, SPEC_MODEL])
def test_chat_answers(client: OpenAI, model: str) -> None:
    reply = client.chat.completions.create(
        model=model, messages=user(CAPITAL_QUESTION), max_tokens=32, temperature=0
    )
    assert reply.choices[0].message.content == CAPITAL_ANSWER
    assert reply.choices[0].finish_reason == "stop"


def test_chat_streams(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=user(CAPITAL_QUESTION), max_tokens=32, temperature=0, stream=True
    )
    parts = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(parts) == CAPITAL_ANSWER
    assert len([p for p in parts if p]) > 1, "the answer came in one piece: not streamed"


def test_completions_answers(client: OpenAI) -> None:
    reply = client.completions.create(
        model=MODEL, prompt=CAPITAL_PROMPT, max_tokens=32, temperature=0
    )
    assert reply.choices[0].text == CAPITAL_ANSWER


def test_completions_streams(client: OpenAI) -> None:
    stream = client.completions.create(
        model=MODEL, prompt=CAPITAL_PROMPT, max_tokens=32, temperature=0, stream=True
    )
    parts = [c.choices[0].text for c in stream if c.choices]
    assert "".join(parts) == CAPITAL_ANSWER
    assert len([p for p in parts if p]) > 1


async def test_async_chat_and_completions(async_client: AsyncOpenAI) -> None:
    chat = await async_client.chat.completions.create(
        model=MODEL, messages=user(CAPITAL_QUESTION), max_tokens=32, temperature=0
    )
    assert chat.choices[0].message.content == CAPITAL_ANSWER
    text = await async_client.completions.create(
        model=MODEL, prompt=CAPITAL_PROMPT, max_tokens=32, temperature=0
    )
    assert text.choices[0].text == CAPITAL_ANSWER


async def test_async_streams(async_client: AsyncOpenAI) -> None:
    stream = await async_client.chat.completions.create(
        model=MODEL, messages=user(CAPITAL_QUESTION), max_tokens=32, temperature=0, stream=True
    )
    parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    assert "".join(parts) == CAPITAL_ANSWER
    completion = await async_client.completions.create(
        model=MODEL, prompt=CAPITAL_PROMPT, max_tokens=32, temperature=0, stream=True
    )
    assert "".join([c.choices[0].text async for c in completion if c.choices]) == CAPITAL_ANSWER


def _engine_delta(engine: Server, before: dict[str, float]) -> tuple[float, float]:
    after = totals(engine.url)
    return delta(before, after, PROMPT_TOKENS), delta(before, after, GENERATION_TOKENS)


def _engine_counted(engine: Server, before: dict[str, float]) -> tuple[float, float]:
    """The engine's token counts since ``before``, once they stop moving (at most 5 s)."""
    seen: list[tuple[float, float]] = []

    def settled(now: tuple[float, float]) -> bool:
        seen.append(now)
        return len(seen) > 1 and seen[-2] == now and now[1] > 0

    return poll(lambda: _engine_delta(engine, before), settled, timeout_s=5.0)


def test_streamed_usage_matches_engine_counters(client: OpenAI, engines: Engines) -> None:
    before = totals(engines.plain.url)
    stream = client.chat.completions.create(
        model=PLAIN_MODEL, messages=user("Name three colours."), max_tokens=40, temperature=0,
        stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].choices == [], "last chunk must be the usage chunk"
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.completion_tokens > 0
    engine = _engine_counted(engines.plain, before)
    print(f"\nstreamed usage {usage.prompt_tokens}+{usage.completion_tokens}, engine {engine}")
    assert engine == (usage.prompt_tokens, usage.completion_tokens)


def test_usage_matches_engine_counters(client: OpenAI, engines: Engines) -> None:
    before = totals(engines.spec.url)
    reply = client.chat.completions.create(
        model=SPEC_MODEL, messages=user("Count from one to ten."), max_tokens=40, temperature=0
    )
    usage = reply.usage
    assert usage is not None and usage.completion_tokens > 0
    engine = _engine_counted(engines.spec, before)
    assert engine == (usage.prompt_tokens, usage.completion_tokens)


def test_model_list_and_readiness(ridge: Server) -> None:
    models = httpx.get(ridge.url + "/v1/models", timeout=5).json()
    assert {m["id"] for m in models["data"]} == {MODEL, PLAIN_MODEL, SPEC_MODEL}
    ready = httpx.get(ridge.url + "/ready", timeout=5)
    assert ready.status_code == 200
