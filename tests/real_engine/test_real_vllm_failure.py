"""An engine that dies never hangs a client. These tests kill the tier's "spec" engine
(SIGKILL to its process group, as a crash would), so they run last in the tier.

1. Killed mid-stream: the client's stream ends (cleanly or with an error event) within
   :data:`BOUND_S` seconds of the kill.
2. Dead before the first byte: a second ridge (one pool holding both engines, polling once a
   minute, so its poller has not noticed the death) gets requests at once; each must be retried
   on the live engine or answered 502/503, within the bound, and the dead engine must really
   have been tried (a retry or a 502/503 shows it).
3. Known dead: the tier's ridge (which polls twice a second) answers a model only the dead
   engine served with 502/503, within the bound.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from openai.types.chat import ChatCompletionChunk

from tests.real_engine.conftest import MODEL, SPEC_MODEL, Engines, ridge_over
from tests.real_engine.prompts import CAPITAL_ANSWER, CAPITAL_QUESTION, user
from tests.real_engine.scrape import totals
from tests.real_engine.servers import Server, pool_entry, port_of, real_fleet

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(600), pytest.mark.kills_engine]

BOUND_S = 15.0
CLEAN_STATUSES = (502, 503)
SLOW_POLL_ENV = {"RIDGE_REGISTRY__POLL_INTERVAL_S": "60", "RIDGE_LOG_LEVEL": "warning"}


@pytest.fixture(scope="module")
def slow_poll_ridge(engines: Engines, log_dir: Path) -> Iterator[Server]:
    """ridge over one pool with both engines; started before any kill, it believes both up."""
    ports = [port_of(engines.plain.url), port_of(engines.spec.url)]
    _, raw = real_fleet([pool_entry("both", [MODEL], ports, {})])
    server = ridge_over(raw, log_dir, "ridge-slow-poll", SLOW_POLL_ENV)
    try:
        yield server
    finally:
        server.stop()


def _drain(chunks: Iterator[ChatCompletionChunk]) -> tuple[str, list[str | None]]:
    """Read to the end; how it ended and the finish reasons seen."""
    reasons: list[str | None] = []
    try:
        for chunk in chunks:
            reasons += [c.finish_reason for c in chunk.choices]
    except openai.APIError as exc:
        return f"error {type(exc).__name__}: {exc}", reasons
    return "ended", reasons


def test_engine_killed_mid_stream(client: OpenAI, engines: Engines,
                                  slow_poll_ridge: Server) -> None:
    stream = client.chat.completions.create(
        model=SPEC_MODEL, messages=user("Write a very long story about a lighthouse keeper."),
        max_tokens=1500, temperature=0, stream=True, extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = iter(stream)
    for _ in range(5):
        next(chunks)
    engines.spec.kill()
    killed = time.monotonic()
    with ThreadPoolExecutor(1) as worker:
        ending = worker.submit(_drain, chunks)
        try:
            how, reasons = ending.result(timeout=BOUND_S)
        except FutureTimeout:
            stream.close()
            pytest.fail(f"the stream hung for {BOUND_S} s after the engine was killed")
    took = time.monotonic() - killed
    print(f"\nengine killed mid-stream: client saw '{how}' {took:.2f} s after the kill")
    assert "length" not in reasons, "the stream completed: the kill came too late to test"


async def _one(client: AsyncOpenAI) -> str:
    try:
        reply = await client.chat.completions.create(
            model=MODEL, messages=user(CAPITAL_QUESTION), max_tokens=16, temperature=0
        )
    except openai.APIStatusError as exc:
        assert exc.status_code in CLEAN_STATUSES, f"unclean error {exc.status_code}: {exc}"
        assert isinstance(exc.body, dict) and "message" in exc.body, "not an OpenAI error body"
        return str(exc.status_code)
    assert reply.choices[0].message.content == CAPITAL_ANSWER
    return "ok"


def _retries(ridge: Server) -> float:
    return totals(ridge.url).get("ridge_upstream_retries_total", 0.0)


async def test_dead_engine_before_first_byte(engines: Engines, slow_poll_ridge: Server) -> None:
    if engines.spec.alive():  # run on its own: kill here
        engines.spec.kill()
    retries_before = _retries(slow_poll_ridge)
    async with AsyncOpenAI(base_url=slow_poll_ridge.url + "/v1", api_key="unused",
                           max_retries=0, timeout=BOUND_S) as ridge_client:
        start = time.monotonic()
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(_one(ridge_client) for _ in range(4))), BOUND_S
        )
    retried = _retries(slow_poll_ridge) - retries_before
    print(f"\ndead engine before the first byte: {outcomes} in {time.monotonic() - start:.2f} s, "
          f"ridge retried {retried:.0f} time(s)")
    assert retried >= 1 or any(o != "ok" for o in outcomes), "the dead engine was never tried"


def test_known_dead_pool_answers_cleanly(ridge: Server, engines: Engines) -> None:
    if engines.spec.alive():  # run on its own: kill here
        engines.spec.kill()
    time.sleep(1.5)  # three poll rounds of the tier's ridge
    start = time.monotonic()
    reply = httpx.post(ridge.url + "/v1/chat/completions", timeout=BOUND_S, json={
        "model": SPEC_MODEL, "messages": [{"role": "user", "content": CAPITAL_QUESTION}],
        "max_tokens": 8,
    })  # fmt: skip
    print(f"\nmodel of a dead pool: HTTP {reply.status_code} in {time.monotonic() - start:.2f} s: "
          f"{reply.text[:200]}")
    assert reply.status_code in CLEAN_STATUSES
    assert "message" in reply.json()["error"]
