"""The routing work alone, per request: ``python -m ridge_bench.overhead.routing_cost``.

What ridge spends deciding, without HTTP: feature extraction, the router state's ``place``
(view, lever policy, scheduler plugins, reservation) and ``finish``, on the overhead
benchmark's fleet with every routing setting default and the in-memory state, after
``--populate`` earlier requests filled the prefix index. Each timed request is a chat of about
``--prompt-tokens`` tokens, half of it a system prompt every request shares. Admission control
is on unless ``--no-admission`` (:meth:`gateway.access.admission.Admission.place`, on its fast
path: every endpoint's capacity known, none full).

Reports the median and p99 [µs] of each step and of the whole over ``--requests`` requests
(one process, sequential, ``time.perf_counter_ns``, the collector tuned as ``ridge serve``
tunes it). A measurement to run and report, not a test.
See docs/benchmarks/overhead.md#the-routing-cost-run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from backends.registry.endpoints import EndpointRegistry
from backends.registry.status import PollResult
from config.fleet import Fleet, parse_fleet
from gateway.access.admission import Admission, Route
from gateway.app import build_admission, build_extractor, build_router
from gateway.cli.main import tune_gc
from gateway.settings import AdmissionSettings
from ridge_bench.harness.gateways import fleet as overhead_fleet
from routing.features import RequestInfo
from routing.load import request_tokens
from routing.router import RoutePlan
from routing.snapshots import EngineMetrics, PoolSnapshot
from routing.state.memory import MemoryState
from routing.state.protocol import Ask, Outcome, Placed, RouterState

MODEL = "bench-model"


@dataclass(frozen=True)
class Timings:
    """Per-request times of each step [ns]."""

    features: list[int]
    place: list[int]
    finish: list[int]


def bench_fleet(endpoints: int) -> Fleet:
    urls = [f"http://127.0.0.1:{20000 + i}" for i in range(endpoints)]
    return parse_fleet(overhead_fleet(urls))


def chat(rng: random.Random, shared: str, prompt_tokens: int) -> dict[str, object]:
    unique = " ".join(f"w{rng.randrange(10**6)}" for _ in range(prompt_tokens // 4))
    return {"model": MODEL, "messages": [{"role": "system", "content": shared},
                                         {"role": "user", "content": unique[:prompt_tokens * 2]}]}


ENGINE = EngineMetrics(running=4.0, waiting=0.0, kv_cache_usage=0.1)
"""What every endpoint reports: capacity known (0.9 × 4 ÷ 0.1 = 36 requests), never reached."""


async def place(state: RouterState, ask: Ask, admission: Admission | None,
                route: Route) -> Placed[RoutePlan] | None:
    """The dispatcher's placement: through admission control, or straight to the state."""
    if admission is not None:
        placed, _ = await admission.place(state, ask, route)
        return placed
    return await state.place(ask, partial(route.router.choose, route.features, route.pools,
                                          exclude=route.exclude))


async def run(endpoints: int, prompt_tokens: int, populate: int, requests: int,
              admission_on: bool = True) -> Timings:
    fleet = bench_fleet(endpoints)
    registry = EndpointRegistry(fleet)
    for url in registry.urls:
        registry.record_poll(url, PollResult(registry.now(), True, ENGINE))
    pools: tuple[PoolSnapshot, ...] = registry.snapshot()
    router, extractor, state = build_router(fleet), build_extractor(fleet), MemoryState()
    admission = build_admission(AdmissionSettings(enabled=admission_on), fleet,
                                registry.snapshot)
    urls = list(registry.urls)
    rng = random.Random(0)
    shared = "You are a helpful assistant. " * (prompt_tokens * 2 // 29)
    timings = Timings([], [], [])
    for i in range(populate + requests):
        payload = chat(rng, shared if i % 4 else f"{i} " + shared, prompt_tokens)
        json.dumps(payload)  # what the gateway parsed it from; not timed
        t0 = time.perf_counter_ns()
        info = RequestInfo("chat", MODEL, None, False, None, state.learned_output(MODEL))
        features = extractor.extract(payload, info)
        t1 = time.perf_counter_ns()
        ask = Ask(MODEL, features.block_hashes, features.session, urls,
                  request_tokens(features.prompt_tokens, features.expected_output_tokens))
        placed = await place(state, ask, admission, Route(router, features, pools, frozenset()))
        t2 = time.perf_counter_ns()
        assert placed is not None
        outcome = Outcome(MODEL, features.block_hashes, features.prompt_tokens, 0, 100, None, True)
        await state.finish(placed.reservations[0], outcome)
        if admission is not None:
            admission.released(placed.reservations[0].endpoint)
        t3 = time.perf_counter_ns()
        if i >= populate:
            timings.features.append(t1 - t0)
            timings.place.append(t2 - t1)
            timings.finish.append(t3 - t2)
    return timings


def _row(name: str, ns: Sequence[int]) -> str:
    cuts = statistics.quantiles(ns, n=100)
    return f"| {name} | {cuts[49] / 1e3:.1f} | {cuts[98] / 1e3:.1f} |"


def report(t: Timings) -> str:
    total = [a + b + c for a, b, c in zip(t.features, t.place, t.finish, strict=True)]
    return "\n".join([
        "| step | p50 [µs] | p99 [µs] |", "|---|---:|---:|",
        _row("features (canonical prompt, block hashes, tokens)", t.features),
        _row("place (admission check, state view, lever policy, scheduler plugins, "
             "reservation)", t.place),
        _row("finish (release, learn)", t.finish),
        _row("**routing work per request**", total),
    ])


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m ridge_bench.overhead.routing_cost",
                                description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--endpoints", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=2000)
    p.add_argument("--populate", type=int, default=5000, help="earlier requests in the index")
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--no-admission", action="store_true", help="admission control off")
    args = p.parse_args(argv)
    tune_gc()  # the collector as the gateway runs it
    timings = asyncio.run(run(args.endpoints, args.prompt_tokens, args.populate, args.requests,
                              not args.no_admission))
    print(f"{args.endpoints} endpoints, ~{args.prompt_tokens}-token prompts, "
          f"{args.populate} requests in the prefix index before timing, "
          f"{args.requests} timed, admission control {'off' if args.no_admission else 'on'}\n")
    print(report(timings))


if __name__ == "__main__":
    main()
