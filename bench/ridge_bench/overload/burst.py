"""Bursts on a mixed fleet: ``ridge bench overload burst [--fleet F] [--requests 120]
[--ramps 0,10] [--seeds 0,1,2] [--gateways 1,2] ...``.

Where ``ridge bench overload`` holds one pool at a multiple of its capacity, this sends a burst
of many times the whole fleet's capacity to every pool kind at once (by default the demo's
fleet: speculative, SGLang radix, chunked prefill and P/D pools, vLLM and SGLang together):
``--requests`` unique long prompts, all at once on cold engines (ramp 0) or spread evenly over
``--ramps`` seconds, admission control off and on, through one gateway or several sharing their
state in a throw-away redis-server (requests dealt round robin). Every run is a fresh
simulator, Redis and gateways. Reported per run and per pool (the ``x-ridge-route`` pool of
each answer or refusal): admitted, refused and failed requests, the admitted requests' TTFT
p50/p99 against the SLO, the time to a refusal, and goodput (requests within every SLO bound
per second of the run). ``--json FILE`` saves every run; each run's records go to
``OUT/RUN/requests.jsonl`` and its plots (:func:`draw_plots`) to ``--plots`` (default
``OUT/plots``). A measurement to run and report, not a test.
See docs/benchmarks/overload.md#bursts-on-the-mixed-demo-fleet.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ridge_bench.compare.benchmark import START_TIMEOUT_S, start_sim
from ridge_bench.harness import plots
from ridge_bench.harness.driver import Bounds, Destination, run_workload
from ridge_bench.harness.goodput import RequestResult, Slo, meets, percentile, write_records
from ridge_bench.harness.procs import ROOT, Child, child_env, start_ridge
from ridge_bench.harness.workloads import CHAT, Arrival, ChatSource, LoadStep, Workload
from ridge_bench.overhead.state_latency import redis_server
from ridge_bench.overload.benchmark import REFUSED, render_fleet

FLEET = ROOT / "gateway" / "demo" / "demo-fleet.yaml"
MODEL = "llama-3-8b"
DEFAULT_OUT = ROOT / "bench-results" / "burst"


@dataclass(frozen=True)
class BurstSetup:
    """What to run (module docstring); times in seconds, token counts inclusive ranges."""

    fleet: Path = FLEET
    requests: int = 120
    ramps_s: tuple[float, ...] = (0.0, 10.0)
    seeds: tuple[int, ...] = (0, 1, 2)
    gateways: tuple[int, ...] = (1, 2)
    baseline: bool = True
    prompt_tokens: tuple[int, int] = (2600, 2800)
    max_tokens: tuple[int, int] = (300, 300)
    drain_s: float = 90.0
    speed: float = 1.0
    out: Path = DEFAULT_OUT


@dataclass(frozen=True)
class Scheduled(Workload):
    """A workload whose arrivals are given (``times``, seconds from the start), not drawn."""

    times: tuple[float, ...] = ()

    def arrivals(self, limit: int) -> list[Arrival]:
        return [Arrival(t, 0, CHAT) for t in self.times[:limit]]


def burst_times(requests: int, ramp_s: float) -> tuple[float, ...]:
    """``requests`` arrival times: all at 0 (ramp 0), else evenly over ``ramp_s``."""
    if ramp_s <= 0:
        return (0.0,) * requests
    return tuple(ramp_s * i / requests for i in range(requests))


def workload(setup: BurstSetup, seed: int, ramp_s: float, times: Sequence[float]) -> Scheduled:
    """Unique long prompts (:class:`ChatSource`) arriving at ``times``."""
    source = ChatSource(seed, setup.prompt_tokens, setup.max_tokens)
    return Scheduled("burst", seed, {CHAT: source}, {CHAT: 1.0}, (LoadStep(1.0, ramp_s + 1.0),),
                     times=tuple(times))


@dataclass
class PoolRow:
    """One pool's figures in one run (TTFT [s], refusal times [ms], goodput [req/s])."""

    pool: str
    sent: int
    admitted: int
    refused: int
    failed: int
    ttft_p50: float | None
    ttft_p99: float | None
    within_ttft: float | None
    refusal_p50_ms: float | None
    refusal_p99_ms: float | None
    goodput: float


@dataclass
class BurstRun:
    """One run: its settings, the whole fleet's row (pool ``*``), one row per pool, the SLO
    [s] and its request records."""

    label: str
    seed: int
    ramp_s: float
    admission: bool
    gateways: int
    window_s: float
    fleet: PoolRow
    pools: list[PoolRow] = field(default_factory=list)
    slo: dict[str, float] = field(default_factory=dict)
    requests_file: str = ""


def draw_plots(runs: Sequence[BurstRun], directory: Path) -> list[Path]:
    """The admitted requests' TTFT p99 per pool and run against the SLO
    (``burst-ttft-p99.png``); per run: TTFT and TPOT over time by pool and their CDFs, the
    outcomes over time (:func:`ridge_bench.harness.plots.draw_requests`) and goodput per pool,
    as ``directory/burst-LABEL-*.png``; the paths written."""
    p99 = {run.label: {row.pool: row.ttft_p99 for row in run.pools} for run in runs}
    slo = next((r.slo["ttft_s"] for r in runs if "ttft_s" in r.slo), None)
    first = plots.grouped_bars(p99, directory / "burst-ttft-p99.png",
                               "bursts: admitted TTFT p99 per pool", "TTFT p99 [s]", "run",
                               line=("TTFT SLO", slo) if slo else None, log=True)
    out = [first] if first is not None else []
    for run in runs:
        samples = plots.read_samples(Path(run.requests_file)) if run.requests_file else []
        title = f"burst {run.label}"
        out += plots.draw_requests(samples, run.slo, directory, f"burst-{run.label}", title)
        goodput = plots.goodput_per_pool({r.pool: r.goodput for r in run.pools},
                                         directory / f"burst-{run.label}-goodput-pools.png",
                                         title)
        out += [goodput] if goodput is not None else []
    return out


def pool_row(pool: str, results: Sequence[RequestResult], slo: Slo, span_s: float) -> PoolRow:
    """The figures of ``results`` (one pool's, or all), over a run of ``span_s`` seconds."""
    admitted = [r for r in results if r.ok]
    refused = [r for r in results if r.error == REFUSED]
    ttft = [r.ttft_s for r in admitted if r.ttft_s is not None]
    refusals = [r.e2e_s * 1e3 for r in refused if r.e2e_s is not None]
    good = sum(meets(r, slo) for r in results)
    within = sum(1 for t in ttft if t <= slo.ttft_s) / len(ttft) if ttft else None
    return PoolRow(pool, len(results), len(admitted), len(refused),
                   len(results) - len(admitted) - len(refused), percentile(ttft, 50),
                   percentile(ttft, 99), within, percentile(refusals, 50),
                   percentile(refusals, 99), good / span_s if span_s > 0 else 0.0)


def rows_by_pool(results: Sequence[RequestResult], slo: Slo, span_s: float) -> list[PoolRow]:
    pools = sorted({r.route.pool or "none" for r in results})
    return [pool_row(p, [r for r in results if (r.route.pool or "none") == p], slo, span_s)
            for p in pools]


def span(results: Sequence[RequestResult]) -> float:
    """Seconds from the first request sent to the last one's end."""
    ends = [r.sent_s + r.e2e_s for r in results if r.e2e_s is not None]
    return max(ends) if ends else 0.0


async def run_once(setup: BurstSetup, seed: int, ramp_s: float, admission: bool,
                   gateways: int) -> BurstRun:
    """One run on a fresh simulator, Redis (for more than one gateway) and gateways."""
    label = f"seed{seed}-ramp{ramp_s:g}-{'on' if admission else 'off'}-gw{gateways}"
    workdir = setup.out / label
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "fleet.yaml"
    slo = render_fleet(setup.fleet, setup.speed, config)
    sim = await start_sim(workdir, config, setup.speed, seed)
    started: list[Child] = []
    try:
        with redis_server() if gateways > 1 else contextlib.nullcontext() as redis_url:
            env = {"RIDGE_LOG_LEVEL": "warning",
                   "RIDGE_ADMISSION__ENABLED": "true" if admission else "false"}
            if redis_url is not None:
                env["RIDGE_REDIS_URL"] = redis_url
            for i in range(gateways):
                started.append(await start_ridge(f"ridge{i}", workdir, config, child_env(env),
                                                 START_TIMEOUT_S))
            results = await _send(setup, seed, ramp_s, [g.url for g in started])
            for child in started:
                await child.stop()
            started.clear()
    finally:
        for child in started:
            await child.stop()
        await sim.stop()
    records = workdir / "requests.jsonl"
    write_records(records, results)
    duration = span(results)
    return BurstRun(label, seed, ramp_s, admission, gateways, duration,
                    pool_row("*", results, slo, duration), rows_by_pool(results, slo, duration),
                    {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "e2e_s": slo.e2e_s},
                    str(records))


async def _send(setup: BurstSetup, seed: int, ramp_s: float,
                urls: Sequence[str]) -> list[RequestResult]:
    """The burst dealt round robin to the gateways at ``urls``, each share sent by a driver of
    its own (its prompts drawn with a seed of its own, so no two requests share a prompt)."""
    times, k = burst_times(setup.requests, ramp_s), len(urls)
    shares = [workload(setup, seed * 1000 + i, ramp_s, times[i::k]) for i in range(k)]
    bounds = Bounds(setup.requests, ramp_s + 1.0, setup.drain_s)
    runs = await asyncio.gather(*(run_workload(w, Destination(url, MODEL), bounds)
                                  for w, url in zip(shares, urls, strict=True)))
    return [r for data in runs for r in data.results]


def plan_runs(setup: BurstSetup) -> Iterator[tuple[int, float, bool, int]]:
    """(seed, ramp, admission, gateways) of every run: admission off through one gateway, then
    on through each count of gateways."""
    for seed in setup.seeds:
        for ramp in setup.ramps_s:
            if setup.baseline:
                yield seed, ramp, False, 1
            for gateways in setup.gateways:
                yield seed, ramp, True, gateways


def _f(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


HEADER = ("| run | pool | sent | admitted | refused | failed | admitted TTFT p50 / p99 [s] "
          "| admitted within TTFT SLO | refusal p50 / p99 [ms] | goodput [req/s] |\n"
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")


def lines(run: BurstRun) -> list[str]:
    """``run`` as rows of :data:`HEADER`: the fleet's, then each pool's."""
    out = []
    for row in (run.fleet, *run.pools):
        within = "–" if row.within_ttft is None else f"{100 * row.within_ttft:.0f} %"
        out.append(f"| {run.label} | {row.pool} | {row.sent} | {row.admitted} | {row.refused} "
                   f"| {row.failed} | {_f(row.ttft_p50)} / {_f(row.ttft_p99)} | {within} "
                   f"| {_f(row.refusal_p50_ms, 1)} / {_f(row.refusal_p99_ms, 1)} "
                   f"| {_f(row.goodput)} |")
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ridge bench overload burst",
                                description=__doc__.splitlines()[0])
    p.add_argument("--fleet", type=Path, default=FLEET)
    p.add_argument("--requests", type=int, default=120)
    p.add_argument("--ramps", default="0,10", help="seconds to spread each burst over (0: "
                   "all at once)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--gateways", default="1,2", help="gateway counts with admission on (more "
                   "than one: sharing a throw-away redis-server)")
    p.add_argument("--prompt-tokens", default="2600,2800")
    p.add_argument("--max-tokens", default="300,300")
    p.add_argument("--no-baseline", action="store_true", help="leave out the runs with "
                   "admission control off")
    p.add_argument("--drain", type=float, default=90.0)
    p.add_argument("--speed", type=float, default=1.0)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--from-results", type=Path, default=None, help="a --json file: print its "
                   "table and draw its plots, running nothing")
    p.add_argument("--plots", default=None, help="folder for the plots (default OUT/plots; '' "
                   "for none)")
    return p


def _pair(text: str) -> tuple[int, int]:
    low, high = (int(x) for x in text.split(","))
    return low, high


def setup_of(args: argparse.Namespace) -> BurstSetup:
    if args.requests <= 0 or args.speed <= 0:
        raise ValueError("--requests and --speed must be positive")
    return BurstSetup(args.fleet, args.requests,
                      tuple(float(x) for x in args.ramps.split(",")),
                      tuple(int(x) for x in args.seeds.split(",")),
                      tuple(int(x) for x in args.gateways.split(",")),
                      not args.no_baseline, _pair(args.prompt_tokens),
                      _pair(args.max_tokens), args.drain, args.speed, args.out)


async def execute(setup: BurstSetup) -> list[BurstRun]:
    runs = []
    print(HEADER, flush=True)
    for seed, ramp, admission, gateways in plan_runs(setup):
        run = await run_once(setup, seed, ramp, admission, gateways)
        print("\n".join(lines(run)), flush=True)
        runs.append(run)
    return runs


def saved(path: Path, out: Path) -> list[BurstRun]:
    """The runs of a ``--json`` file (a run saved without its records' path: ``out/LABEL``'s)."""
    runs = []
    for raw in json.loads(path.read_text()):
        fleet = PoolRow(**raw.pop("fleet"))
        pools = [PoolRow(**row) for row in raw.pop("pools")]
        run = BurstRun(**raw, fleet=fleet, pools=pools)
        if not run.requests_file:
            run.requests_file = str(out / run.label / "requests.jsonl")
        runs.append(run)
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        setup = setup_of(args)
    except ValueError as exc:
        print(f"ridge bench overload burst: {exc}", file=sys.stderr)
        return 2
    if args.from_results is not None:
        runs = saved(args.from_results, setup.out)
        print("\n".join([HEADER, *(line for run in runs for line in lines(run))]))
    else:
        runs = asyncio.run(execute(setup))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=1))
    where = plots.plot_dir(args.plots, setup.out / "plots")
    if where is not None:
        where.mkdir(parents=True, exist_ok=True)
        plots.draw_or_say(lambda: draw_plots(runs, where), "ridge bench overload burst")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
