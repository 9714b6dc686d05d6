"""Worker scaling: ``ridge serve --workers N`` for several N, in front of the engine stand-in.

``python -m ridge_bench.overhead.scaling [--workers 1,2] [--rounds 3] [--seconds 6]
[--connections 256] [--wrk-threads 2] [--doc docs/benchmarks/overhead.md]``: the stand-in,
ridge with its defaults and ``--workers N``, and wrk share every core (nothing pinned); each
round starts ridge once per N in a rotated order, warms it up and measures one window.

Per window: req/s, the gateway's CPU per request (supervisor and workers, from ``/proc``), busy
cores, errors. Derived per N: **speed-up** = req/s(N) ÷ req/s(1) and **CPU scaling** =
N × CPU/request(1) ÷ CPU/request(N). The summary is the median over rounds; the doc's
``overhead:workers`` block is rewritten and the results kept as ``overhead-workers.json``. A
measurement to run and report, not a test. See docs/benchmarks/overhead.md#worker-scalings-run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ridge_bench.harness import gateways
from ridge_bench.harness.doc_block import write_block
from ridge_bench.harness.gateways import Gateway, Launch
from ridge_bench.harness.procs import ROOT, Child, machine_busy_seconds, start_upstream
from ridge_bench.harness.upstream import MODEL
from ridge_bench.overhead import doc as overhead_doc
from ridge_bench.overhead import wrk
from ridge_bench.overhead.benchmark import DEFAULT_DOC, DEFAULT_OUT, body

SECTION = "workers"
START_TIMEOUT_S = 90.0
WARMUP_S = 1.0


@dataclass(frozen=True)
class ScalingSetup:
    """One scaling run. Times in seconds."""

    workers: tuple[int, ...] = (1, 2)
    rounds: int = 3
    seconds: float = 6.0
    connections: int = 256
    wrk_threads: int = 2
    endpoints: int = 8


@dataclass
class ScalingWindow:
    """One measured window: ``workers`` workers in round ``round``."""

    round: int
    workers: int
    ok: int = 0
    errors: int = 0
    wall_s: float = 0.0
    gateway_cpu_s: float | None = None
    machine_busy_s: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None

    def figures(self) -> dict[str, float | None]:
        wall = self.wall_s or float("nan")
        cpu = self.gateway_cpu_s
        return {"rps": self.ok / wall,
                "cpu_us": None if cpu is None or not self.ok else cpu / self.ok * 1e6,
                "gateway_cores": None if cpu is None else cpu / wall,
                "machine_cores": None if self.machine_busy_s is None
                else self.machine_busy_s / wall,
                "p50_ms": self.p50_ms, "p99_ms": self.p99_ms}


def target(workers: int) -> Gateway:
    return Gateway(f"ridge-w{workers}", f"ridge, --workers {workers}", "ridge", workers=workers)


async def measure(setup: ScalingSetup, urls: Sequence[str], script: Path, workdir: Path,
                  workers: int, round_no: int) -> ScalingWindow:
    """Start ridge with ``workers`` workers, run the window, stop it."""
    where = workdir / f"round{round_no}-w{workers}"
    where.mkdir(parents=True, exist_ok=True)
    child = await gateways.start(target(workers), Launch(), urls, where, None, START_TIMEOUT_S)
    try:
        url = child.url + "/v1/chat/completions"
        await wrk.run(url, script, setup.connections, WARMUP_S, threads=setup.wrk_threads)
        return await _window(setup, child, url, script, workers, round_no)
    finally:
        await child.stop()


async def _window(setup: ScalingSetup, child: Child, url: str, script: Path, workers: int,
                  round_no: int) -> ScalingWindow:
    loop = asyncio.get_running_loop()
    cpu0, busy0, t0 = child.cpu_seconds(), machine_busy_seconds(), loop.time()
    result = await wrk.run(url, script, setup.connections, setup.seconds,
                           threads=setup.wrk_threads)
    cpu1, busy1, t1 = child.cpu_seconds(), machine_busy_seconds(), loop.time()
    window = ScalingWindow(round_no, workers, result.ok, result.errors, t1 - t0,
                           None if cpu0 is None or cpu1 is None else cpu1 - cpu0,
                           None if busy0 is None or busy1 is None else busy1 - busy0,
                           result.p50_ms, result.p99_ms)
    f = window.figures()
    print(f"  round {round_no + 1} workers {workers}: req/s {f['rps']:.0f} cpu µs/req "
          f"{f['cpu_us'] or 0:.0f} gateway cores {f['gateway_cores'] or 0:.2f} "
          f"errors {window.errors}", flush=True)
    return window


def rotated(values: Sequence[int], round_no: int) -> list[int]:
    k = round_no % len(values) if values else 0
    return [*values[k:], *values[:k]]


def summary(windows: Sequence[ScalingWindow]) -> dict[int, dict[str, Any]]:
    """workers → the median of each figure over rounds, summed errors, and the speed-up and
    CPU scaling against the smallest worker count measured (module doc)."""
    by: dict[int, list[ScalingWindow]] = {}
    for w in windows:
        by.setdefault(w.workers, []).append(w)
    out: dict[int, dict[str, Any]] = {}
    for n, rows in sorted(by.items()):
        figures = [r.figures() for r in rows]
        cell: dict[str, Any] = {k: _median([f[k] for f in figures]) for k in figures[0]}
        cell.update(errors=sum(r.errors for r in rows), rounds=len(rows))
        out[n] = cell
    if out:
        base_n = min(out)
        base = out[base_n]
        for n, cell in out.items():
            cell["speedup"] = _ratio(cell["rps"], base["rps"])
            cell["cpu_scaling"] = _ratio(base["cpu_us"], cell["cpu_us"], n / base_n)
    return out


def _ratio(a: float | None, b: float | None, scale: float = 1.0) -> float | None:
    return None if a is None or not b else a / b * scale


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def markdown(data: Mapping[str, Any]) -> str:
    meta = data["meta"]
    lines = [f"### Worker scaling: ridge {meta['ridge']}", "",
             f"Run {meta['started']}; command: `{meta['command']}`", "",
             f"- Machine: {meta['machine']}",
             f"- {meta['rounds']} round(s), medians; {meta['seconds']:.0f} s windows after a "
             f"1 s warm-up; wrk with {meta['wrk_threads']} thread(s) and {meta['connections']} "
             "connections, non-streamed; nothing pinned (workers, stand-in and wrk share "
             "every core)", "",
             "| workers | req/s | speed-up | gateway CPU µs/request | CPU scaling | gateway "
             "busy cores | machine busy cores | latency p50 / p99 [ms] | errors |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n, c in sorted(data["summary"].items(), key=lambda kv: int(kv[0])):
        lines.append(
            f"| {n} | {_n(c['rps'])} | {_x(c['speedup'])} | {_n(c['cpu_us'])} | "
            f"{_x(c['cpu_scaling'])} | {_n(c['gateway_cores'], 2)} | "
            f"{_n(c['machine_cores'], 2)} | {_n(c['p50_ms'], 2)} / {_n(c['p99_ms'], 2)} | "
            f"{c['errors']} |")
    return "\n".join(lines)


def _n(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def write_doc(doc: Path, data: Mapping[str, Any]) -> None:
    """Replace the workers block of ``doc`` (appended when it has none)."""
    write_block(doc, overhead_doc.begin(SECTION), overhead_doc.end(SECTION), markdown(data))


async def execute(setup: ScalingSetup, out: Path, command: str) -> dict[str, Any]:
    workdir = out / "scaling-logs"
    workdir.mkdir(parents=True, exist_ok=True)
    script = workdir / "json.lua"
    script.write_text(wrk.script(body(MODEL, stream=False)))
    started = overhead_doc.now()
    upstream, urls = await start_upstream(workdir, setup.endpoints, 20, 30.0, None)
    windows: list[ScalingWindow] = []
    try:
        for round_no in range(setup.rounds):
            print(f"round {round_no + 1}/{setup.rounds}", flush=True)
            for n in rotated(setup.workers, round_no):
                windows.append(await measure(setup, urls, script, workdir, n, round_no))
    finally:
        await upstream.stop()
    meta = {"ridge": overhead_doc.ridge_version(ROOT), "started": started,
            "command": command, "machine": overhead_doc.machine(), **asdict(setup)}
    return {"meta": meta, "windows": [asdict(w) | w.figures() for w in windows],
            "summary": summary(windows)}


def _doc_path(value: str) -> Path | None:
    """``--doc``: a path, or None for '' (no doc)."""
    return Path(value) if value else None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ridge_bench.overhead.scaling",
                                description=__doc__.splitlines()[0] if __doc__ else None)
    default_workers = "1,2" if (os.cpu_count() or 1) <= 2 else f"1,2,{os.cpu_count()}"
    p.add_argument("--workers", default=default_workers, help="comma-separated worker counts")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--connections", type=int, default=256)
    p.add_argument("--wrk-threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--doc", type=_doc_path, default=DEFAULT_DOC,
                   help="'' to leave the doc alone")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    if not wrk.available():
        print("ridge bench scaling: wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 2
    workers = tuple(int(n) for n in args.workers.split(",") if n)
    if not workers or min(workers) < 1 or args.rounds < 1 or args.seconds <= 0:
        print("ridge bench scaling: bad --workers, --rounds or --seconds", file=sys.stderr)
        return 2
    setup = ScalingSetup(workers, args.rounds, args.seconds, args.connections, args.wrk_threads)
    command = " ".join(["python -m ridge_bench.overhead.scaling", *argv])
    data = asyncio.run(execute(setup, args.out.resolve(), command))
    if args.doc is not None:
        write_doc(args.doc, data)
        kept = args.doc.with_name(f"{args.doc.stem}-{SECTION}.json")
        kept.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {args.doc} (section {SECTION}) and {kept}")
    return 0 if data["summary"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
