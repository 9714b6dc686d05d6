"""Replay seeded benchmark workloads through ridge's routing, deterministically, and record
every decision: the behaviour pin of the router.

No HTTP and no wall clock: a discrete-event loop on a fake clock. Each arrival of a workload
(:mod:`ridge_bench.harness.workloads`, seed 0, default rate) is parsed, routed and reserved by the
gateway's
own routing path; a fake upstream answers at once. The request then holds its endpoint(s) for
a deterministic service time, 0.05 s + 0.1 ms per uncached prompt token + 20 ms per output
token × (1 + 0.05 × requests on the endpoint when it started), and finishes with
``max_tokens`` output tokens. Every simulated second the endpoints' engine gauges are
"polled": running = the requests the replay holds there (at most 48), waiting = the rest.

The trace of a cell (fleet × workload) is one line per request: pool, decode pool, endpoint,
prefill endpoint, lever, reason and detail. :func:`trace` returns it; the test compares its
digest with the one recorded in ``tests/data/decision_trace.json``. ``admission``: route
through admission control (:mod:`gateway.access.admission`, default settings, the fleet's SLOs) too.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from backends.registry.endpoints import EndpointRegistry
from backends.registry.status import PollResult
from config.fleet import Fleet, parse_fleet
from gateway.access.admission import Admission, AdmissionConfig
from gateway.app import build_router
from gateway.request.body import ApiPath, ParsedRequest, parse_request
from gateway.request.dispatch import Attempts, Dispatched, Dispatcher
from gateway.telemetry.slos import slo_policy
from ridge_bench.harness.turns import Dispatcher as Turns
from ridge_bench.harness.turns import Pending
from ridge_bench.harness.workloads import build, placeholder_reply
from routing.features import FeatureExtractor
from routing.snapshots import EngineMetrics
from routing.state.memory import MemoryState

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "decision_trace.json"
REQUESTS = 200
DURATION_S = 60.0
POLL_S = 1.0
BATCH = 48

MIXED_SCORERS = {"cache_aware": 1.0, "prefix_match": 0.5, "session_affinity": 0.3,
                 "least_load": 0.2}
FLEETS: Mapping[str, tuple[str, dict[str, Any] | None]] = {
    "round_robin": ("deploy/bench/homogeneous.yaml",
                    {"filters": ["healthy"], "scorers": {}, "picker": "round_robin"}),
    "least_load": ("deploy/bench/homogeneous.yaml",
                   {"filters": ["healthy"], "scorers": {"least_load": 1.0}}),
    "cache_aware": ("deploy/bench/homogeneous.yaml", {"scorers": {"cache_aware": 1.0}}),
    "mixed_scorers": ("deploy/bench/homogeneous.yaml",
                      {"filters": ["healthy", "not_saturated"], "scorers": MIXED_SCORERS}),
    "random_top": ("deploy/bench/homogeneous.yaml",
                   {"scorers": {"cache_aware": 1.0}, "picker": "random_top", "seed": 7}),
    "ridge": ("deploy/bench/levers.yaml", None),
    "ridge_sglang": ("deploy/bench/levers-sglang.yaml", None),
    "demo_pd": ("gateway/demo/demo-fleet.yaml", None),
}
WORKLOADS = ("agent", "rag", "chat", "mixed", "chat_ramp")
RATES: Mapping[str, float] = MappingProxyType(
    {"agent": 16.0, "rag": 10.0, "chat": 1.5, "mixed": 18.0, "chat_ramp": 9.0})
"""Requests/s per workload: the router benchmark's rates when the trace was recorded, kept
here so that a change of the benchmark's defaults does not change the recorded decisions."""


def load_fleet_for(name: str) -> Fleet:
    path, scheduler = FLEETS[name]
    raw = yaml.safe_load((ROOT / path).read_text())
    if scheduler is not None:
        raw.setdefault("routing", {})["scheduler"] = scheduler
    return parse_fleet(raw, source=path)


@dataclass(order=True)
class _Event:
    at: float
    seq: int
    kind: str = field(compare=False)
    data: Any = field(compare=False, default=None)


@dataclass
class FakeClock:
    now: float = 1_000.0

    def __call__(self) -> float:
        return self.now


class _Response:
    status = 200
    headers: Mapping[str, str] = {}
    closes_at_once = True

    async def read(self) -> bytes:
        return b'{"kv_transfer_params": {"remote_engine_id": "e"}}'

    async def close(self) -> None:
        return None


class _Client:
    async def send(self, url: str, body: bytes, headers: Mapping[str, str]) -> _Response:
        return _Response()


@dataclass
class Routed:
    """One routed request: its trace line, the endpoints it holds, its uncached tokens."""

    line: str
    urls: tuple[str, ...]
    uncached: int
    sent: Dispatched
    parsed: ParsedRequest


class ReplayRouter:
    """The gateway's routing path (features, state, policy, scheduler, reservations) with a
    fake upstream, on ``clock``."""

    def __init__(self, fleet: Fleet, clock: FakeClock, admission: bool = False) -> None:
        self._clock = clock
        self._registry = EndpointRegistry(fleet, metrics_ttl_s=None, clock=clock)
        self.poll({})
        gate = Admission(AdmissionConfig(), slo_policy(fleet), self._registry.snapshot,
                         clock=clock) if admission else None
        self._dispatcher = Dispatcher(self._registry, _Client(), build_router(fleet),  # type: ignore[arg-type]
                                      MemoryState(clock=clock), FeatureExtractor(), 1,
                                      admission=gate)

    def poll(self, figures: Mapping[str, tuple[int, int]]) -> None:
        for url in self._registry.urls:
            running, waiting = figures.get(url, (0, 0))
            metrics = EngineMetrics(running=float(running), waiting=float(waiting))
            self._registry.record_poll(url, PollResult(self._clock(), True, metrics))

    async def route(self, body: bytes, session: str | None) -> Routed:
        parsed = parse_request(ApiPath.CHAT, body)
        sent = await self._dispatcher.dispatch(parsed, session, Attempts())
        plan, d = sent.plan, sent.plan.decision
        first = plan.prefill or plan.endpoint
        line = "|".join([d.pool, d.decode_pool or "-", plan.endpoint.url,
                         plan.prefill.url if plan.prefill else "-", d.lever, d.reason, d.detail])
        matched = sent.features.matched_tokens(sent.view.matched_blocks.get(first.url, 0))
        urls = tuple(e.url for e in (plan.prefill, plan.endpoint) if e is not None)
        return Routed(line, urls, sent.features.prompt_tokens - matched, sent, parsed)

    async def finish(self, routed: Routed, output_tokens: int) -> None:
        await self._dispatcher.finish(routed.sent, routed.parsed, succeeded=True,
                                      output_tokens=output_tokens, prompt_tokens=None)

    async def aclose(self) -> None:
        return None


def _service_s(uncached: int, output: int, load: int) -> float:
    return 0.05 + 1e-4 * uncached + 0.02 * output * (1.0 + 0.05 * load)


async def _replay(fleet: Fleet, workload: str, admission: bool) -> list[str]:
    clock = FakeClock()
    router = ReplayRouter(fleet, clock, admission)
    work = build(workload, seed=0, rate=RATES[workload], duration_s=DURATION_S)
    turns = Turns(work.sources)
    events: list[_Event] = []
    seq = 0
    for arrival in work.arrivals(REQUESTS):
        events.append(_Event(clock.now + arrival.at_s, seq, "arrive", arrival.kind))
        seq += 1
    polls = int(DURATION_S * 3 / POLL_S)
    for k in range(polls):
        events.append(_Event(clock.now + k * POLL_S, -1 - k, "poll"))
    heapq.heapify(events)
    held: Counter[str] = Counter()
    lines: list[str] = []
    while events:
        ev = heapq.heappop(events)
        clock.now = ev.at
        if ev.kind == "poll":
            router.poll({url: (min(n, BATCH), max(0, n - BATCH)) for url, n in held.items()})
        elif ev.kind == "arrive":
            pending = turns.take(ev.data)
            routed = await router.route(_body(pending), session=pending.session.conversation.key
                                        if workload == "agent" else None)
            lines.append(routed.line)
            for url in routed.urls:
                held[url] += 1
            load = max(held[u] for u in routed.urls) if routed.urls else 0
            done = clock.now + _service_s(routed.uncached, pending.max_tokens, load)
            heapq.heappush(events, _Event(done, seq, "finish", (routed, pending)))
            seq += 1
        else:
            routed, pending = ev.data
            for url in routed.urls:
                held[url] -= 1
            await router.finish(routed, pending.max_tokens)
            conv = pending.session.conversation
            turns.done(pending, placeholder_reply(conv.key, pending.turn, pending.max_tokens))
    await router.aclose()
    return lines


def _body(pending: Pending) -> bytes:
    return json.dumps({"model": "llama-3-8b", "messages": pending.messages,
                       "max_tokens": pending.max_tokens, "stream": True}).encode()


def trace(fleet_name: str, workload: str, admission: bool = False) -> list[str]:
    """The decision trace of one cell (see the module docstring)."""
    return asyncio.run(_replay(load_fleet_for(fleet_name), workload, admission))


def digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def record(path: Path = GOLDEN) -> None:
    """Write every cell's digest and a summary of its decisions to ``path``."""
    out: dict[str, Any] = {}
    for fleet_name in FLEETS:
        for workload in WORKLOADS:
            lines = trace(fleet_name, workload)
            pools = Counter(line.split("|")[0] for line in lines)
            out[f"{fleet_name}/{workload}"] = {
                "requests": len(lines), "digest": digest(lines),
                "pools": dict(sorted(pools.items())),
            }
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    record()
