"""The router comparison: every router × every workload on the same simulated GPUs.

``python -m ridge_bench.compare [--workloads agent,rag,chat,mixed] [--routers ...] [--requests 400]
[--duration 60] [--rate agent=12 ...] [--out DIR] [--doc docs/benchmarks/router.md]``

Each cell (router, workload), in order, with nothing shared between cells:

1. render the router's fleet file on free 127.0.0.1 ports (:mod:`ridge_bench.fleets`);
2. start the simulator (``python -m backends.sim --config F --speed S --seed N``) and wait for
   its ready line, then ``ridge serve --config F`` on a free port and wait for ``/ready``
   (:func:`ridge_bench.procs.start_ridge`); both are child processes with their own logs in
   ``DIR/<cell>/``;
3. run the workload with :func:`ridge_bench.command.execute` in this process (open loop,
   bounded, the engines' metrics scraped before and after);
4. read the CPU time the simulator, ridge and this client used during the run, and the whole
   machine's; stop ridge, then the simulator (SIGTERM to each child's pid, then SIGKILL).

A process over ``SATURATED_CORE_FRACTION`` of one core during a run is flagged: the simulator
is one event loop (past that, simulated time slips and the GPUs look slower than they are),
and a saturated client or gateway measures itself, not the router. Results go to
``DIR/results.json`` after every cell; ``--doc`` rewrites the generated part of the doc
(:mod:`ridge_bench.compare_doc`), and ``--from-results DIR/results.json --doc FILE`` rewrites it
from saved results without running anything. Ctrl-C stops the current cell cleanly and skips
the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shlex
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ridge_bench import compare_doc, fleets
from ridge_bench.command import DEFAULT_RATES, Options, execute
from ridge_bench.goodput import Slo
from ridge_bench.procs import (
    ROOT,
    Child,
    child_env,
    free_port,
    machine_busy_seconds,
    start_ridge,
)
from ridge_bench.router_report import report_dict, text
from ridge_bench.workloads import NAMES

SATURATED_CORE_FRACTION = 0.8
START_TIMEOUT_S = 60.0
SETTLE_S = 2.0


@dataclass(frozen=True)
class Matrix:
    """What to run: cells are (router, workload); every run uses ``template`` with the cell's
    workload and rate filled in."""

    routers: Mapping[str, fleets.Router]
    workloads: tuple[str, ...]
    rates: Mapping[str, float]
    durations: Mapping[str, float]
    template: Options
    speed: float
    out: Path
    command: str = ""

    def meta(self) -> dict[str, Any]:
        return compare_doc.meta(self.template, self.rates, self.durations, self.speed,
                                self.command)


def _env() -> dict[str, str]:
    # no access log: ridge's CPU goes to routing
    return child_env({"RIDGE_LOG_LEVEL": "warning"})


async def start_sim(workdir: Path, config: Path, speed: float, seed: int) -> Child:
    """The simulated fleet, ready (its "simulating" line printed) or RuntimeError with its log."""
    log_path = workdir / "sim.log"
    argv = [sys.executable, "-m", "backends.sim", "--config", str(config), "--speed",
            str(speed), "--seed", str(seed)]
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=ROOT, env=_env(), stdin=asyncio.subprocess.DEVNULL, stdout=log,
            stderr=log)
    child = Child("sim", proc, log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and proc.returncode is None:
        if b"simulating" in log_path.read_bytes():
            return child
        await asyncio.sleep(0.1)
    await child.stop()
    raise RuntimeError(f"simulator did not start:\n{child.log_tail()}")


@dataclass
class CpuMeter:
    """CPU seconds of the children and the machine between :meth:`begin` and :meth:`end`."""

    children: Mapping[str, Child]
    start: dict[str, float | None] | None = None
    began: float = 0.0

    def _read(self) -> dict[str, float | None]:
        out = {name: c.cpu_seconds() for name, c in self.children.items()}
        out["machine"] = machine_busy_seconds()
        return out

    def begin(self) -> None:
        self.start, self.began = self._read(), time.monotonic()

    def end(self) -> dict[str, Any]:
        """Per process: CPU seconds and percent of one core over the wall time."""
        assert self.start is not None
        wall = time.monotonic() - self.began
        now = self._read()
        out: dict[str, Any] = {"wall_s": wall}
        for name, before in self.start.items():
            after = now[name]
            used = None if before is None or after is None else after - before
            out[name] = {"cpu_s": used, "core_pct": None if used is None else 100 * used / wall}
        return out


def saturated(cpu: Mapping[str, Any], client_cpu_s: float) -> list[str]:
    """Processes that used more than ``SATURATED_CORE_FRACTION`` of one core."""
    wall = float(cpu["wall_s"])
    flagged = [name for name, v in cpu.items() if name not in ("wall_s", "machine")
               and isinstance(v, dict) and v["cpu_s"] is not None
               and v["cpu_s"] > SATURATED_CORE_FRACTION * wall]
    if client_cpu_s > SATURATED_CORE_FRACTION * wall:
        flagged.append("client")
    return flagged


async def run_cell(matrix: Matrix, router_name: str, workload: str,
                   stop: asyncio.Event) -> dict[str, Any]:
    """One cell, started and torn down (module doc); its report as JSON values."""
    router = matrix.routers[router_name]
    workdir = matrix.out / f"{workload}-{router_name}"
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "fleet.yaml"
    fleet = fleets.render(router, config, free_port)
    opts = replace(matrix.template, workload=workload, rate=matrix.rates[workload],
                   duration_s=matrix.durations[workload], fleet=fleet)
    sim = await start_sim(workdir, config, matrix.speed, opts.seed)
    ridge: Child | None = None
    try:
        ridge = await start_ridge("ridge", workdir, config, _env(), START_TIMEOUT_S)
        meter = CpuMeter({"sim": sim, "ridge": ridge})
        meter.begin()
        report = await execute(replace(opts, url=ridge.url), stop,
                               {"router": router_name, "fleet": router.fleet.name})
        cpu = meter.end()
    finally:
        if ridge is not None:
            await ridge.stop()
        await sim.stop()
    print(text(report), flush=True)
    return {**report_dict(report), "cpu": cpu,
            "saturated": saturated(cpu, report.client_cpu_s)}


def _save(out: Path, results: list[dict[str, Any]], matrix: Matrix) -> None:
    body = {"meta": matrix.meta(), "cells": results}
    (out / "results.json").write_text(json.dumps(body, indent=1) + "\n")


async def run_matrix(matrix: Matrix, doc: Path | None) -> int:
    """Every cell in order; results saved after each; the doc rewritten at the end."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError):
        loop.add_signal_handler(signal.SIGINT, stop.set)
    matrix.out.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    for workload in matrix.workloads:
        for router in matrix.routers:
            if stop.is_set():
                break
            print(f"== {workload} × {router}", file=sys.stderr, flush=True)
            results.append(await run_cell(matrix, router, workload, stop))
            _save(matrix.out, results, matrix)
            await asyncio.sleep(SETTLE_S)
    if doc is not None and not stop.is_set():
        compare_doc.write_doc(doc, compare_doc.markdown(results, matrix.meta()))
    return 130 if stop.is_set() else 0


def per_workload(items: Sequence[str], defaults: Mapping[str, float], flag: str
                 ) -> dict[str, float]:
    """``defaults`` overridden by ``WORKLOAD=VALUE`` items (a bare ``VALUE``: every workload)."""
    out = dict(defaults)
    for item in items:
        name, sep, value = item.rpartition("=")
        if sep and name not in out:
            raise SystemExit(f"{flag} wants [WORKLOAD=]VALUE with WORKLOAD in {NAMES}")
        for key in ([name] if sep else list(out)):
            out[key] = float(value)
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ridge_bench.compare",
                                description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default=",".join(NAMES))
    p.add_argument("--routers", default=",".join(fleets.ROUTERS))
    p.add_argument("--extra-router", action="append", default=[], metavar="NAME=FLEET_FILE",
                   help="also run this fleet file with its own routing (add NAME to --routers)")
    p.add_argument("--rate", action="append", default=[], metavar="[WORKLOAD=]RPS",
                   help=f"requests/s (mixed: the heaviest step); defaults {dict(DEFAULT_RATES)}")
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--duration", action="append", default=[], metavar="[WORKLOAD=]SECONDS",
                   help="seconds bound (default 60)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--slo-ttft", type=float, default=2.0)
    p.add_argument("--slo-tpot", type=float, default=0.1)
    p.add_argument("--slo-e2e", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--speed", type=float, default=1.0, help="simulated time speed-up")
    p.add_argument("--out", default="bench-results/router", help="results directory")
    p.add_argument("--doc", help="rewrite the generated part of this markdown file")
    p.add_argument("--progress", action="store_true", help="progress bar per cell")
    p.add_argument("--from-results", metavar="RESULTS_JSON",
                   help="run nothing: rewrite --doc from a saved results.json")
    return p


def matrix_of(args: argparse.Namespace) -> Matrix:
    known = dict(fleets.ROUTERS)
    for spec in args.extra_router:
        extra = fleets.custom_router(spec)
        known[extra.name] = extra
        if extra.name not in args.routers.split(","):
            args.routers += "," + extra.name
    workloads = tuple(w for w in args.workloads.split(",") if w)
    names = [r for r in args.routers.split(",") if r]
    bad = [w for w in workloads if w not in NAMES] + [r for r in names if r not in known]
    if bad:
        raise SystemExit(f"unknown workloads or routers: {bad}")
    template = Options(
        workload=workloads[0], url="", model=None, rate=0.0, steps=args.steps,
        requests=args.requests, duration_s=0.0, drain_s=args.slo_e2e,
        slo=Slo(args.slo_ttft, args.slo_tpot, args.slo_e2e), seed=args.seed,
        progress=args.progress,
    )
    routers = {name: known[name] for name in names}
    rates = per_workload(args.rate, DEFAULT_RATES, "--rate")
    durations = per_workload(args.duration, dict.fromkeys(NAMES, 60.0), "--duration")
    return Matrix(routers, workloads, rates, durations, template, args.speed, Path(args.out))


def command_line(argv: Sequence[str]) -> str:
    """How this run was started, to print in the doc."""
    return " ".join(["python -m ridge_bench.compare", *(shlex.quote(a) for a in argv)])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    if args.from_results:
        if not args.doc:
            raise SystemExit("--from-results needs --doc")
        saved = json.loads(Path(args.from_results).read_text())
        compare_doc.write_doc(Path(args.doc), compare_doc.markdown(saved["cells"], saved["meta"]))
        return 0
    matrix = replace(matrix_of(args), command=command_line(argv))
    return asyncio.run(run_matrix(matrix, Path(args.doc) if args.doc else None))


if __name__ == "__main__":
    raise SystemExit(main())
