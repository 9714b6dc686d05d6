"""``ridge bench``: replay a named workload against a gateway and report goodput.

``ridge bench --workload NAME --url URL --rate R --requests N --duration S --slo-ttft T
--slo-tpot T --slo-e2e T [--fleet FILE] [--json FILE] [--requests-out FILE]``: open loop
(Poisson arrivals whatever the gateway's speed), bounded, then a drain of ``--drain`` seconds;
Ctrl-C prints the partial report (exit 130). ``--fleet`` lets the engines' own prefix-cache
hit rate be scraped; ``--requests-out`` writes every request's record. ``ridge bench --trace
FILE`` replays a Mooncake trace instead (:mod:`ridge_bench.replay.trace`); ``--plots DIR``
draws the run's PNGs there (:func:`draw_plots`). Definitions: :mod:`ridge_bench.harness.goodput`.

``ridge bench overhead|scaling|routing-cost|overload|fidelity|calibrate ...`` run the other
benchmarks (:func:`run` hands them on). Entry point for the ``ridge`` command (entry-point group
``ridge.commands``, name ``bench``): :func:`run` (``argv`` without the ``bench`` word).
See docs/benchmarks/router.md#the-ridge-bench-command.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import aiohttp

from config.fleet import Fleet, FleetConfigError, load_fleet
from ridge_bench.compare.report import RunReport, build_report, report_dict, text
from ridge_bench.harness import engines, plots
from ridge_bench.harness.driver import Bounds, Destination, RunData, run_workload
from ridge_bench.harness.goodput import Slo, in_simulated_time, record, write_records
from ridge_bench.harness.progress import Progress
from ridge_bench.harness.workloads import NAMES, LoadStep, Workload, build, theoretical_f
from ridge_bench.replay.trace import TraceWorkload, trace_workload, workload_f

DEFAULT_RATES: Mapping[str, float] = MappingProxyType(
    {"agent": 16.0, "rag": 10.0, "chat": 1.5, "mixed": 21.0, "chat_ramp": 9.0})
"""Requests/s per workload when ``--rate`` is not given (mixed, chat_ramp: the heaviest step).
Chosen for the 8-GPU benchmark fleets (``deploy/bench/``): the load at which round-robin meets
the SLOs for about half of the requests (chat: a low load, few requests in flight per GPU;
chat_ramp: 3 → 6 → 9 req/s). How each rate was picked, and what
round-robin met at the rates around it, is in docs/benchmarks/router.md (Workloads)."""


@dataclass(frozen=True)
class Options:
    """One benchmark run, as the command line describes it."""

    workload: str
    url: str
    model: str | None
    rate: float
    steps: int
    requests: int
    duration_s: float
    drain_s: float
    slo: Slo
    seed: int = 0
    fleet: Fleet | None = None
    ignore_eos: bool = True
    progress: bool = True
    replay: TraceWorkload | None = None
    """``--trace``: the trace to replay instead of the named workload."""
    speed: float = 1.0
    """How many times faster than real time the engines run (a simulator's ``--speed``): the
    workload's arrivals, the drain and the duration bound are divided by it, and the report
    is in simulated seconds (every measured time × ``speed``)."""
    requests_out: Path | None = None
    """``--requests-out``: write every request's record here, one JSON line each
    (:func:`ridge_bench.harness.goodput.record`), in simulated seconds like the report."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ridge bench", description=__doc__.splitlines()[0],
        epilog="ridge bench overhead --help: the gateway overhead benchmark instead")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--workload", choices=NAMES)
    what.add_argument("--trace", help="replay this Mooncake-format trace (JSONL) instead")
    p.add_argument("--speedup", type=float, default=1.0,
                   help="--trace: replay this many times faster than recorded (default 1)")
    p.add_argument("--speed", type=float, default=1.0,
                   help="the engines are a simulator run this many times faster than real time "
                   "(python -m backends.sim --speed): arrivals, bounds and drain are divided by "
                   "it and the report is in simulated seconds (default 1)")
    p.add_argument("--block-tokens", type=int, default=512,
                   help="--trace: prompt tokens per hash id (default 512, Mooncake's)")
    p.add_argument("--url", default="http://127.0.0.1:8080", help="the gateway's base URL")
    p.add_argument("--model", help="model name (default: the first of GET /v1/models)")
    p.add_argument("--rate", type=float, help="requests/s (mixed, chat_ramp: the heaviest step); "
                   f"defaults {dict(DEFAULT_RATES)}")
    p.add_argument("--steps", type=int, default=3, help="mixed, chat_ramp: load steps (default 3)")
    p.add_argument("--requests", "--max-requests", dest="requests", type=int,
                   help="request bound (default 400; --trace: the whole trace)")
    p.add_argument("--duration", "--max-seconds", dest="duration", type=float,
                   help="seconds bound (default 60; --trace: the whole trace)")
    p.add_argument("--drain", type=float, help="seconds to wait for requests in flight "
                   "after sending stops (default: --slo-e2e)")
    p.add_argument("--slo-ttft", type=float, default=2.0, help="seconds (default 2.0)")
    p.add_argument("--slo-tpot", type=float, default=0.1, help="seconds/token (default 0.1)")
    p.add_argument("--slo-e2e", type=float, default=30.0, help="seconds (default 30)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fleet", help="fleet file behind the gateway (scrapes engine metrics)")
    p.add_argument("--json", help="also write the report as JSON to this file")
    p.add_argument("--requests-out", metavar="FILE",
                   help="also write every request (key, times, tokens, error, pool, replica) "
                        "to this file, one JSON line each")
    p.add_argument("--plots", metavar="DIR",
                   help="also draw the run's plots into this folder, WORKLOAD-PLOT.png (TTFT "
                        "and TPOT over time and their CDFs, refusals over time, goodput per "
                        "pool, with --fleet the hit rate per replica)")
    p.add_argument("--no-ignore-eos", action="store_true",
                   help="let engines stop early (default: ignore_eos, exact max_tokens)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def options(args: argparse.Namespace) -> Options:
    """Validated options; ValueError for impossible bounds or a bad trace."""
    if args.speed <= 0:
        raise ValueError("--speed must be positive")
    replay = trace_workload(args.trace, args.seed, args.speedup * args.speed,
                            args.block_tokens) if args.trace else None
    requests, duration = _bounds(args, replay)
    if requests < 1 or duration <= 0 or args.steps < 1:
        raise ValueError("--requests and --steps must be at least 1, --duration positive")
    if replay is not None:
        name, rate = replay.name, replay.steps[0].rate
    else:
        name = args.workload
        rate = args.rate if args.rate is not None else DEFAULT_RATES[args.workload]
    slo = Slo(args.slo_ttft, args.slo_tpot, args.slo_e2e)
    return Options(
        workload=name, url=args.url.rstrip("/"), model=args.model, rate=rate,
        steps=args.steps, requests=requests, duration_s=duration, replay=replay,
        drain_s=args.drain if args.drain is not None else args.slo_e2e, slo=slo,
        seed=args.seed, fleet=load_fleet(args.fleet) if args.fleet else None,
        ignore_eos=not args.no_ignore_eos, progress=not args.no_progress, speed=args.speed,
        requests_out=Path(args.requests_out) if args.requests_out else None,
    )


def _bounds(args: argparse.Namespace, replay: TraceWorkload | None) -> tuple[int, float]:
    """(requests, seconds): as given, else 400 and 60 — for a trace, its length and span."""
    if replay is None:
        return (400 if args.requests is None else args.requests,
                60.0 if args.duration is None else args.duration)
    return (len(replay.times_s) if args.requests is None else args.requests,
            replay.steps[0].duration_s * args.speed if args.duration is None
            else args.duration)


def _workload(opts: Options) -> tuple[Workload, float]:
    """The workload to run and its f by construction."""
    if opts.replay is not None:
        return opts.replay, workload_f(opts.replay, opts.requests)
    workload = build(opts.workload, opts.seed, opts.rate * opts.speed,
                     opts.duration_s / opts.speed, opts.steps)
    return workload, theoretical_f(workload)


def _simulated_steps(workload: Workload, speed: float) -> Workload:
    """``workload`` with its load steps in simulated seconds (:attr:`Options.speed`)."""
    return replace(workload, steps=tuple(LoadStep(s.rate / speed, s.duration_s * speed)
                                         for s in workload.steps))


def _simulated(data: RunData, speed: float) -> RunData:
    """``data`` in simulated seconds (:attr:`Options.speed`)."""
    return replace(data, results=[in_simulated_time(r, speed) for r in data.results],
                   window_s=data.window_s * speed, wall_s=data.wall_s * speed)


async def first_model(url: str) -> str:
    """The first model the gateway lists."""
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session, \
            session.get(url + "/v1/models") as resp:
        body: Any = await resp.json()
    return str(body["data"][0]["id"])


async def execute(opts: Options, stop: asyncio.Event | None = None,
                  labels: Mapping[str, Any] | None = None) -> RunReport:
    """One run: scrape the engines, drive the workload, scrape again, report."""
    workload, f_theory = _workload(opts)
    model = opts.model or await first_model(opts.url)
    before = await engines.scrape(opts.fleet) if opts.fleet else None
    progress = Progress(opts.workload, opts.requests, opts.duration_s / opts.speed) \
        if opts.progress else None
    data = await run_workload(workload, Destination(opts.url, model, opts.ignore_eos),
                              Bounds(opts.requests, opts.duration_s / opts.speed,
                                     opts.drain_s / opts.speed),
                              stop=stop, progress=progress)
    if opts.speed != 1.0:
        data, workload = _simulated(data, opts.speed), _simulated_steps(workload, opts.speed)
    if opts.requests_out is not None:
        write_records(opts.requests_out, data.results)
    cache = None
    if opts.fleet is not None and before is not None:
        cache = engines.cache_use(opts.fleet, before, await engines.scrape(opts.fleet))
    return build_report(workload, data, opts.slo, f_theory, cache,
                        {"url": opts.url, "model": model, **(labels or {})})


async def _main(opts: Options) -> RunReport:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError):
        loop.add_signal_handler(signal.SIGINT, stop.set)
    try:
        return await execute(opts, stop)
    finally:
        with contextlib.suppress(NotImplementedError):
            loop.remove_signal_handler(signal.SIGINT)


def draw_plots(report: RunReport, directory: Path) -> list[Path]:
    """The run's plots (:func:`ridge_bench.harness.plots.draw_run`) in ``directory``, each
    named after the workload (``agent-ttft-time.png``; a trace's: ``trace-...``), drawn from
    the report's JSON values and its requests' records; the paths written."""
    samples = [plots.sample_of(record(r)) for r in report.results]
    return plots.draw_run(report_dict(report), samples, directory,
                          report.workload.split()[0], report.workload)


def run(argv: Sequence[str] | None = None) -> int:
    """``ridge bench``; returns the exit status (0 done, 2 bad arguments or unreachable
    gateway, 130 interrupted)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["overhead"]:
        from ridge_bench.overhead import benchmark as overhead

        return overhead.main(argv[1:])
    if argv[:1] == ["scaling"]:
        from ridge_bench.overhead import scaling

        return scaling.main(argv[1:])
    if argv[:1] == ["overload"]:
        from ridge_bench.overload import benchmark as overload

        return overload.main(argv[1:])
    if argv[:1] == ["fidelity"]:
        from ridge_bench.fidelity import benchmark as fidelity

        return fidelity.main(argv[1:])
    if argv[:1] == ["calibrate"]:
        from ridge_bench.fidelity import calibrate

        return calibrate.main(argv[1:])
    if argv[:1] == ["routing-cost"]:
        from ridge_bench.overhead import routing_cost

        routing_cost.main(argv[1:])
        return 0
    args = parser().parse_args(argv)
    try:
        opts = options(args)
        report = asyncio.run(_main(opts))
    except (ValueError, FleetConfigError) as exc:
        print(f"ridge bench: {exc}", file=sys.stderr)
        return 2
    except (aiohttp.ClientError, OSError) as exc:
        print(f"ridge bench: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 2
    print(text(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report_dict(report), indent=1) + "\n")
    if args.plots:
        plots.draw_or_say(lambda: draw_plots(report, Path(args.plots)), "ridge bench")
    return 130 if report.interrupted else 0


if __name__ == "__main__":
    raise SystemExit(run())
