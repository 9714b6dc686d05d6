"""ridge's prefix index against what the real vLLM engine holds, with the engine's KV events.

One engine with prefix caching, KV-cache events on (``kv_events`` in the fleet file: rendered
``--kv-events-config``, a ZMQ publisher and its replay socket) and a small KV cache (24 blocks
of 128 tokens: 3,072 tokens), so the varied traffic below makes it evict. ridge in front of it
has the model's tokenizer (exact prompt tokens) and follows the events.

For every request, sent one at a time: ridge's predicted cached tokens (the increment of
``ridge_prefix_predicted_tokens_total``: the blocks its index said the engine held, at most
prompt − 1) against the engine's own ``usage.prompt_tokens_details.cached_tokens``, and
ridge's prompt token count (its feature extraction, the gateway's code) against the engine's
``prompt_tokens``; and, for comparison, what the approximate index (what was sent where, no
events) would have predicted. The requests: conversations over three shared system prompts whose
histories grow turn by turn (the engine's own answers fed back), unique prompts, and repeats
of earlier prompts once the engine has evicted them.

ridge also records the traffic as a trace (``RIDGE_TRACE__PATH``, Mooncake format, 128-token
blocks): its hash ids must repeat exactly where the prompts share whole blocks.

This module starts its own engine and stops it at the end; it sorts before the tier's shared
engines start, so at most two engines are ever up.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from config.fleet import parse_fleet
from gateway.app import build_extractor
from routing.features import RequestInfo
from routing.prefix_index import PrefixIndex
from tests.real_engine.scrape import delta, poll, totals
from tests.real_engine.servers import (
    Server,
    engine_paths,
    free_port,
    one_engine_and_ridge,
    pool_entry,
)

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(900)]

MODEL = "smollm2-135m"
BLOCKS = 24
WORDS = (  # noqa: SIM905 (a word list reads better as text)
    "river stone window garden paper silver morning engine market forest signal harbor "
    "copper lantern meadow bridge winter candle orbit planet thunder valley canyon "
    "compass ladder mirror pocket rocket saddle timber velvet wagon zephyr anchor basket "
    "cabin dragon falcon glacier hammer island jungle kettle lemon magnet needle"
).split()


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)) + "."


@dataclass
class Seen:
    """One request: ridge's prediction and count against the engine's."""

    name: str
    prompt: int
    ridge_prompt: int
    cached: int
    predicted: int
    guessed: int
    """What the approximate index (no events: what was sent there) would have predicted, in
    the engine's whole 128-token blocks (the fairest reading of it)."""


def entry(port: int) -> dict[str, Any]:
    pool = pool_entry("events", [MODEL], [port], {"prefix_caching": True})
    pool["kv_events"] = {"port": free_port(), "replay_port": free_port()}
    pool["engine_args"] = ["--num-gpu-blocks-override", str(BLOCKS)]
    return pool


def routing_extra() -> dict[str, Any]:
    return {"routing": {"features": {"tokenizers": {MODEL: str(engine_paths().model_dir)}}}}


TRACE_BLOCK = 128  # tokens per trace hash id: the engine's block


@dataclass
class Run:
    """The traffic below, served once for the module: what each request saw, ridge's metrics
    after it, and the trace ridge recorded of it."""

    seen: list[Seen]
    metrics: dict[str, float]
    trace: list[dict[str, Any]]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    logs = tmp_path_factory.mktemp("kv-events")
    pool = entry(free_port())
    fleet = parse_fleet({"pools": [pool], **routing_extra()})
    trace = logs / "trace.jsonl"
    env = {"RIDGE_TRACE__PATH": str(trace), "RIDGE_TRACE__BLOCK_TOKENS": str(TRACE_BLOCK),
           "RIDGE_TRACE__FLUSH_INTERVAL_S": "0.2"}
    with one_engine_and_ridge(pool, logs, fleet_extra=routing_extra(),
                              ridge_env=env) as (_, ridge):
        poll(lambda: totals(ridge.url), lambda t: t.get("ridge_kv_events_batches_total", 0)
             + t.get("ridge_kv_events_replays_total", 0) > 0, timeout_s=120)  # subscribed
        seen = traffic(ridge, build_extractor(fleet))
        lines = poll(lambda: trace.read_text().splitlines() if trace.exists() else [],
                     lambda got: len(got) >= len(seen), timeout_s=60)
        yield Run(seen, totals(ridge.url), [json.loads(line) for line in lines])


def ask(ridge: Server, extractor: Any, guess: PrefixIndex, name: str,
        messages: list[dict[str, str]]) -> tuple[Seen, str]:
    body = {"model": MODEL, "messages": messages, "max_tokens": 12, "temperature": 0}
    before = totals(ridge.url)
    reply = httpx.post(ridge.url + "/v1/chat/completions", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    usage = data["usage"]
    after = poll(lambda: totals(ridge.url),
                 lambda t: delta(before, t, "ridge_requests_total") >= 1, timeout_s=30)
    features = extractor.extract(body, RequestInfo("chat", MODEL))
    guessed = guess.match(features.block_hashes, ["engine"]).get("engine", 0)
    guess.record("engine", features.block_hashes)
    seen = Seen(name, usage["prompt_tokens"], features.prompt_tokens,
                (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
                int(delta(before, after, "ridge_prefix_predicted_tokens_total")),
                min(features.matched_tokens(guessed) // 128 * 128, usage["prompt_tokens"] - 1))
    return seen, data["choices"][0]["message"]["content"]


def traffic(ridge: Server, extractor: Any) -> list[Seen]:
    """~55 requests: 8 conversations of 4 turns over 3 system prompts, interleaved, with
    unique prompts between them; then the first unique prompts again (evicted by then: the
    traffic sent far more distinct tokens than the engine holds) and the conversations'
    openings."""
    rng, guess = random.Random(11), PrefixIndex(1_000_000, 600.0)
    systems = [text(rng, 260) for _ in range(3)]
    talks = [[{"role": "system", "content": systems[i % 3]}] for i in range(8)]
    uniques = [[{"role": "user", "content": text(rng, 330)}] for _ in range(16)]
    seen: list[Seen] = []
    for turn in range(4):
        for i, talk in enumerate(talks):
            talk.append({"role": "user", "content": text(rng, 40)})
            got, answer = ask(ridge, extractor, guess, f"talk{i}.turn{turn}", talk)
            seen.append(got)
            talk.append({"role": "assistant", "content": answer})
            if i % 2 == 1:
                n = len([s for s in seen if s.name.startswith("unique")])
                seen.append(ask(ridge, extractor, guess, f"unique{n}", uniques[n])[0])
    for i in range(4):
        seen.append(ask(ridge, extractor, guess, f"again.unique{i}", uniques[i])[0])
    for i, talk in enumerate(talks[:4]):
        seen.append(ask(ridge, extractor, guess, f"again.talk{i}", talk[:2])[0])
    return seen


def test_the_index_predicts_what_the_engine_serves_from_its_cache(
        run: Run, record_property: Any) -> None:
    seen = run.seen
    exact = [s for s in seen if s.predicted == s.cached]
    wrong = [s for s in seen if s.predicted != s.cached]
    report = "\n".join(f"{s.name}: prompt {s.prompt} (ridge {s.ridge_prompt}), engine cached "
                       f"{s.cached}, ridge predicted {s.predicted} (without events {s.guessed})"
                       for s in seen)
    guessed = [s for s in seen if s.guessed == s.cached]
    print(f"\n{len(exact)}/{len(seen)} predictions exact with the engine's events, "
          f"{len(guessed)}/{len(seen)} with the approximate index alone\n{report}")
    record_property("exact", f"{len(exact)}/{len(seen)}")
    record_property("exact_without_events", f"{len(guessed)}/{len(seen)}")
    assert len(seen) >= 50
    assert [s for s in seen if s.prompt != s.ridge_prompt] == []
    assert len(exact) >= 0.95 * len(seen), wrong
    assert len([s for s in seen if s.cached > 0]) >= 20  # system prompts, histories
    again = [s for s in seen if s.name.startswith("again.unique")]
    assert all(s.cached < s.prompt // 128 * 128 for s in again), again  # evicted: recomputed
    assert all(s.predicted == s.cached for s in again), again  # and ridge knew it
    metrics = run.metrics
    assert metrics.get("ridge_kv_events_resets_total", 0.0) == 0.0
    assert metrics.get("ridge_kv_events_decode_errors_total", 0.0) == 0.0
    assert 0 < metrics.get("ridge_kv_event_index_blocks", 0.0) <= BLOCKS * 128 // 16


def test_the_trace_of_that_traffic_repeats_ids_where_prompts_share_prefixes(run: Run) -> None:
    """The trace recorder on real traffic (Mooncake format, 128-token blocks here): one line a
    request, in order (they were sent one at a time), the engine's prompt length, and equal
    hash ids exactly where the prompts share whole blocks."""
    lines = {s.name: line for s, line in zip(run.seen, run.trace, strict=True)}
    for s in run.seen:
        line = lines[s.name]
        assert line["input_length"] == s.prompt, s
        assert len(line["hash_ids"]) == -(-s.prompt // TRACE_BLOCK), s
    for talk in range(8):  # each turn's prompt holds the previous one whole
        for turn in range(3):
            before, after = (lines[f"talk{talk}.turn{t}"] for t in (turn, turn + 1))
            full = before["input_length"] // TRACE_BLOCK
            assert after["hash_ids"][:full] == before["hash_ids"][:full]
            assert after["hash_ids"][full:full + 1] != before["hash_ids"][full:full + 1]
    first = [lines[f"talk{i}.turn0"]["hash_ids"] for i in range(8)]
    for i in range(3):  # talks i and i + 3 share system prompt i (2 whole blocks of it)
        assert first[i][:2] == first[i + 3][:2]
        assert first[i][0] != first[(i + 1) % 3][0]
    for i in range(4):  # a prompt sent again: the very same ids
        assert lines[f"again.unique{i}"]["hash_ids"] == lines[f"unique{i}"]["hash_ids"]
    uniques = {i for n, line in lines.items() if n.startswith("unique")
               for i in line["hash_ids"]}
    talks = {i for n, line in lines.items() if n.startswith("talk") for i in line["hash_ids"]}
    assert not uniques & talks
