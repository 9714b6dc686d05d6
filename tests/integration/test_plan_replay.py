"""A plan's prediction against a wall-clock replay: the same trace, seed and request bodies
through ``ridge serve`` (uvicorn, loopback HTTP) in front of the simulator's HTTP servers on
the wall clock, against the virtual-time replay the planner scores (:mod:`gateway.plan.evaluate`).
Each request must land in the same pool, and the time to first token and per output token
agree within the noise of a real-time run on a loaded machine."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp

from backends.sim import start_fleet
from config.fleet import parse_fleet
from gateway.plan.evaluate import evaluate, request_body
from gateway.plan.space import Brief, Part, candidate, fleet_document
from gateway.plan.trace import BlockTexts, TraceEntry, load_trace
from gateway.settings import Settings
from tests.fakes.harness import free_ports, running_ridge

TRACE = Path(__file__).resolve().parents[2] / "bench" / "ridge_bench" / "traces" / \
    "conversations.jsonl"
REQUESTS = 30
SEED = 4
BRIEF = Brief("llama-3-8b", "nvidia-l4", ttft_s=1.0, tpot_s=0.08)
Row = tuple[str, float, float]
"""One request: the pool ridge chose, TTFT and TPOT [s]."""


def _fleet_doc(*parts: Part) -> dict[str, Any]:
    doc = fleet_document(candidate(*parts), BRIEF)
    ports = iter(free_ports(sum(p.gpus for p in parts)))
    for pool in doc["pools"]:
        pool["endpoints"] = [f"http://127.0.0.1:{next(ports)}" for _ in pool["endpoints"]]
    return doc


def _both(doc: dict[str, Any]) -> tuple[list[Row], list[Row]]:
    """(pool, TTFT, TPOT) per request: predicted on virtual time, then measured."""
    entries = load_trace(TRACE)[:REQUESTS]
    predicted = evaluate(parse_fleet(doc), entries, settings=Settings(auth="off"), seed=SEED)
    measured = asyncio.run(_wall_clock(doc, entries))
    return [(s.pool, s.ttft_s or 0.0, s.tpot_s or 0.0) for s in predicted.served], measured


def _close(measured: float, predicted: float, share: float, floor_s: float = 0.0) -> bool:
    return abs(measured - predicted) <= share * predicted + floor_s


async def _one(session: aiohttp.ClientSession, url: str, body: bytes, at: float,
               start: float) -> Row:
    """(pool, TTFT, TPOT) [s] of one streamed request sent ``at`` seconds after ``start``."""
    await asyncio.sleep(max(0.0, start + at - time.monotonic()))
    sent = time.monotonic()
    first = last = None
    async with session.post(url + "/v1/chat/completions", data=body,
                            headers={"content-type": "application/json"}) as reply:
        assert reply.status == 200, await reply.text()
        pool = reply.headers["x-ridge-route"].split(";")[0].removeprefix("pool=")
        async for chunk in reply.content.iter_any():
            if chunk:
                last = time.monotonic()
                first = last if first is None else first
    assert first is not None and last is not None
    return pool, first - sent, last - first


async def _wall_clock(doc: dict[str, Any], entries: list[TraceEntry]) -> list[Row]:
    fleet = parse_fleet(doc)
    sim = await start_fleet(fleet, seed=SEED)
    texts = BlockTexts(SEED)
    zero = entries[0].timestamp_ms
    try:
        async with running_ridge(fleet, Settings(auth="off")) as ridge, \
                aiohttp.ClientSession() as session:
            start = time.monotonic() + 0.5
            answers = await asyncio.gather(*(
                _one(session, ridge.url, request_body(e, texts, "llama-3-8b"),
                     (e.timestamp_ms - zero) / 1000.0, start) for e in entries))
    finally:
        await sim.stop()
    return [(pool, ttft, gap / max(1, e.output_length - 1))
            for (pool, ttft, gap), e in zip(answers, entries, strict=True)]


def test_per_request_the_virtual_engine_agrees_with_the_real_time_one() -> None:
    """One engine, no routing choice: each request's own TTFT and TPOT."""
    predicted, measured = _both(_fleet_doc(Part("general", 1)))
    ttft_ok = [_close(m[1], p[1], 0.15, 0.02) for p, m in zip(predicted, measured, strict=True)]
    tpot_ok = [_close(m[2], p[2], 0.15) for p, m in zip(predicted, measured, strict=True)]
    assert sum(ttft_ok) >= 0.9 * REQUESTS, list(zip(predicted, measured, strict=True))
    assert sum(tpot_ok) >= 0.9 * REQUESTS, list(zip(predicted, measured, strict=True))


def test_a_routed_fleets_prediction_holds_within_the_replays_noise() -> None:
    """Two pools: timing decides some ties between them, so the check is on the whole."""
    predicted, measured = _both(_fleet_doc(Part("general", 1), Part("chunk-512", 1)))
    shares = [sum(r[0] == "general" for r in rows) / REQUESTS for rows in (predicted, measured)]
    assert abs(shares[0] - shares[1]) <= 0.25, shares
    ttft = [statistics.median(r[1] for r in rows) for rows in (predicted, measured)]
    tpot = [statistics.median(r[2] for r in rows) for rows in (predicted, measured)]
    assert _close(ttft[1], ttft[0], 0.15, 0.02), ttft
    assert _close(tpot[1], tpot[0], 0.15), tpot
