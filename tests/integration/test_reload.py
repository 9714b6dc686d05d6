"""Fleet reloads under load, through a real ridge on real sockets, drop no request.

Three fake engines; the fleet file's one pool starts with the first two. Two clients send
requests back to back (streamed and not, eight tokens at 20 ms a token) while:

1. once the first engine has a request in flight, ``POST /admin/reload`` applies a file that
   removes it and adds the third: the answer counts one endpoint added and one draining; the
   removed one finishes its request, then leaves the registry and its gauges, and gets nothing
   new; the added one serves requests;
2. a reload with a bad file answers 400 (OpenAI-shaped) and changes nothing.

Asserted: every request of the run ends whole with 200 (zero failed), and ridge counts as many
200s as the clients saw. Waits are bounded generously and serve as hang detectors only.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml

from config.fleet import load_fleet
from tests.fakes.engine import WORDS, FakeEngine
from tests.fakes.harness import HARDWARE, MODEL_FACTS, quick_settings, running_ridge

TOKENS = 8
TEXT = " ".join(WORDS[i % len(WORDS)] for i in range(TOKENS))


@dataclass(frozen=True)
class Outcome:
    stream: bool
    status: int
    text: str
    done: bool

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.text == TEXT and (self.done or not self.stream)


def write_fleet(path: Path, urls: list[str]) -> None:
    path.write_text(yaml.safe_dump({"pools": [
        {"name": "a", "engine": "vllm", "models": ["m"], "endpoints": urls,
         "model": MODEL_FACTS, "hardware": HARDWARE}]}))


async def wait_for(predicate: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def one_request(http: aiohttp.ClientSession, url: str, stream: bool) -> Outcome:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": TOKENS, "stream": stream}
    async with http.post(url + "/v1/chat/completions", json=body) as resp:
        raw = await resp.read()
    if resp.status != 200:
        return Outcome(stream, resp.status, raw.decode(errors="replace"), False)
    if not stream:
        return Outcome(stream, 200, json.loads(raw)["choices"][0]["message"]["content"], True)
    events = [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content") or ""
                   for e in events[:-1] if json.loads(e).get("choices"))
    return Outcome(stream, 200, text, events[-1:] == ["[DONE]"])


async def client(http: aiohttp.ClientSession, url: str, index: int, stop: asyncio.Event,
                 outcomes: list[Outcome]) -> None:
    sent = 0
    while not stop.is_set():
        outcomes.append(await one_request(http, url, stream=(sent + index) % 2 == 0))
        sent += 1


async def test_reloads_under_steady_load_fail_no_request(tmp_path: Path) -> None:
    engines = [FakeEngine(tokens=TOKENS, token_interval_s=0.02) for _ in range(3)]
    for engine in engines:
        await engine.start()
    first, second, third = engines
    path = tmp_path / "fleet.yaml"
    write_fleet(path, [first.url, second.url])
    outcomes: list[Outcome] = []
    stop = asyncio.Event()
    try:
        async with (
            running_ridge(load_fleet(path), quick_settings(config=str(path))) as ridge,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http,
        ):
            registry = ridge.gateway.registry
            clients = [asyncio.create_task(client(http, ridge.url, i, stop, outcomes))
                       for i in range(2)]
            try:
                assert await wait_for(lambda: first.running > 0 and len(outcomes) >= 4)
                served_before = first.served
                write_fleet(path, [second.url, third.url])
                async with http.post(ridge.url + "/admin/reload") as resp:
                    assert resp.status == 200, await resp.text()
                    answer = await resp.json()
                assert answer["endpoints"] == {"added": 1, "draining": 1, "total": 2}
                assert first.url not in [e.url for p in registry.snapshot() for e in p.endpoints]
                # its request in flight finishes there, then it leaves the registry
                assert await wait_for(lambda: first.url not in registry.urls)
                assert first.served > served_before
                sent_to_first = len(first.bodies)
                assert await wait_for(lambda: third.served >= 4)  # the new endpoint serves
                up = ridge.metrics.get_sample_value
                assert up("ridge_endpoint_up", {"pool": "a", "endpoint": first.url}) is None
                assert up("ridge_endpoint_up", {"pool": "a", "endpoint": third.url}) == 1.0

                path.write_text("pools:\n  - {name: a, engine: vllm}\n")  # no models, no URLs
                async with http.post(ridge.url + "/admin/reload") as resp:
                    assert resp.status == 400
                    error = (await resp.json())["error"]
                assert error["code"] == "invalid_fleet" and "pools.0.models" in error["message"]
                assert ridge.gateway.fleet.pools[0].endpoint_urls() == [second.url, third.url]
                done = len(outcomes)
                assert await wait_for(lambda: len(outcomes) >= done + 6)
            finally:
                stop.set()
                await asyncio.wait_for(asyncio.gather(*clients), 60)
            assert len(first.bodies) == sent_to_first  # nothing new went to the removed one
            failed = [o for o in outcomes if not o.ok]
            assert not failed, failed[:5]
            assert ridge.metrics.get_sample_value(
                "ridge_requests_total", {"model": "m", "pool": "a", "status": "200"}
            ) == len(outcomes)
    finally:
        for engine in engines:
            await engine.stop()
