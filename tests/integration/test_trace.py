"""Traffic recording and replay end to end: ridge in front of simulated engines records a
Mooncake-format trace whose hash ids repeat exactly where prompts share prefixes, and
``ridge bench --trace`` replays it against the gateway, the engines' prefix caches hitting."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from backends.sim import start_fleet
from config.fleet import Fleet, parse_fleet
from ridge_bench.command import Options, execute
from ridge_bench.harness.goodput import Slo
from ridge_bench.replay.trace import trace_workload
from tests.fakes.harness import HARDWARE, MODEL_FACTS, free_ports, quick_settings, running_ridge

BLOCK = 64  # tokens per hash id: four router blocks of 16
SYSTEM = " ".join(f"Rule {i}: answer politely, cite sources, keep to the topic." for i in
                  range(40))  # ≈ 2,400 characters ≈ 600 tokens: 9 whole trace blocks


def sim_fleet() -> Fleet:
    return parse_fleet({"pools": [{
        "name": "radix", "engine": "sglang", "models": ["m"], "model": MODEL_FACTS,
        "hardware": HARDWARE, "levers": {"prefix_caching": True},
        "simulator": {"profile": "generic-gpu"},  # the harness's test hardware has no profile
        "endpoints": [f"http://127.0.0.1:{p}" for p in free_ports(2)]}]})


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    fleet = sim_fleet()
    sim = await start_fleet(fleet, speed=20.0, seed=1)
    try:
        yield fleet
    finally:
        await sim.stop()


async def _chat(url: str, messages: list[dict[str, str]]) -> None:
    body: dict[str, Any] = {"model": "m", "messages": messages, "max_tokens": 8}
    async with aiohttp.ClientSession() as session, \
            session.post(url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_record_then_replay(fleet: Fleet, tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    settings = quick_settings(trace={"path": str(path), "block_tokens": BLOCK,
                                     "flush_interval_s": 0.05})
    system = {"role": "system", "content": SYSTEM}
    first = [system, {"role": "user", "content": "What is rule 7 about? " * 20}]
    async with running_ridge(fleet, settings) as ridge:
        await _chat(ridge.url, first)
        await _chat(ridge.url, [*first, {"role": "assistant", "content": "Politeness. " * 30},
                                {"role": "user", "content": "And rule 9? " * 20}])
        await _chat(ridge.url, [system, {"role": "user", "content": "Summarise. " * 40}])
    a, b, c = _records(path)  # one at a time: completion order is arrival order
    ids = [r["hash_ids"] for r in (a, b, c)]
    whole = len(a["hash_ids"]) - 1  # a's whole blocks (its last one is partial)
    assert ids[1][:whole] == ids[0][:whole]  # the follow-up extends the first prompt
    shared = 9  # the system prompt's whole blocks
    assert ids[2][:shared] == ids[0][:shared] and ids[2][shared] not in ids[0] + ids[1]
    assert max(len(set(i)) - len(i) for i in ids) == 0  # no id twice within one prompt
    assert [r["output_length"] for r in (a, b, c)] == [8, 8, 8]
    assert a["timestamp"] == 0 <= b["timestamp"] <= c["timestamp"]

    workload = trace_workload(path, seed=0, speedup=10.0, block_tokens=BLOCK)
    async with running_ridge(fleet) as ridge:
        report = await execute(Options(
            workload=workload.name, url=ridge.url, model="m", rate=workload.steps[0].rate,
            steps=1, requests=3, duration_s=5.0, drain_s=10.0, slo=Slo(5.0, 1.0, 10.0),
            fleet=fleet, progress=False, replay=workload, requests_out=tmp_path / "r.jsonl"))
    assert report.summary.requests == 3 and report.summary.ok == 3
    sent = sorted(_records(tmp_path / "r.jsonl"), key=lambda r: r["key"])
    assert [r["key"] for r in sent] == ["trace-000000:0", "trace-000001:0", "trace-000002:0"]
    assert all(r["error"] is None and r["endpoint"] in ("0", "1") and r["pool"] for r in sent)
    assert [r["output_tokens"] for r in sent] == [8, 8, 8]
    assert report.cache is not None and (report.cache.total.hit_rate or 0.0) > 0
    assert report.f_theory > 0
