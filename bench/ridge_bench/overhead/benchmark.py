"""The gateway overhead benchmark: CPU per request and per streamed chunk, req/s, latency.

What each gateway costs, and the time to first token it adds, in front of an engine stand-in
that costs next to nothing (:mod:`ridge_bench.harness.upstream`). ``python -m
ridge_bench.overhead`` (or ``ridge bench overhead``) ``[--rounds N] [--seconds S]
[--gateways ...] [--ridge-src DIR] [--section NAME] [--out DIR] [--doc FILE] [--plots DIR]``;
``--from-results FILE`` only rewrites the doc and draws the plots (:func:`draw_plots`).

Each round starts every target once, in an order rotated by one per round, pinned to its own
core where two are usable, and runs each scenario (``json32``, ``json256``, ``burst32``:
:mod:`ridge_bench.overhead.wrk`; ``paced32``: :mod:`ridge_bench.overhead.stream_client`) as a
warm-up and a measured window. A window gives the gateway's CPU per request or per relayed
event (from ``/proc``), requests/s, latency, errors and busy shares; the summary is the median
over rounds. The doc's block for ``--section`` is rewritten (:mod:`ridge_bench.overhead.doc`).
See docs/benchmarks/overhead.md#the-overhead-benchmarks-run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import shutil
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ridge_bench.harness import gateways, plots
from ridge_bench.harness.gateways import Gateway, Launch
from ridge_bench.harness.procs import ROOT, Child, machine_busy_seconds, start_upstream
from ridge_bench.harness.upstream import MODEL, PACED_MODEL, run_loop
from ridge_bench.overhead import doc as overhead_doc
from ridge_bench.overhead import stream_client, wrk
from ridge_bench.overhead.stream_client import StreamResult

DIRECT = Gateway("direct", "direct to the stand-in (no gateway)", "direct")
SCENARIOS = ("json32", "json256", "burst32", "paced32")
START_TIMEOUT_S = 90.0
DEFAULT_DOC = ROOT / "docs" / "benchmarks" / "overhead.md"
DEFAULT_OUT = ROOT / "bench-results" / "overhead"


def body(model: str, stream: bool) -> bytes:
    """A small chat completion request (what every scenario sends)."""
    request: dict[str, Any] = {"model": model, "max_tokens": 20,
                               "messages": [{"role": "user", "content": "Count to twenty."}]}
    if stream:  # with usage, as a client that counts tokens asks
        request.update(stream=True, stream_options={"include_usage": True})
    return json.dumps(request, separators=(",", ":")).encode()


@dataclass(frozen=True)
class OverheadSetup:
    """One benchmark run, as the command line describes it. Times in seconds."""

    targets: tuple[Gateway, ...]
    rounds: int = 3
    seconds: float = 4.0
    paced_seconds: float = 5.0
    warmup_s: float = 1.0
    concurrency: tuple[int, int] = (32, 256)
    stream_concurrency: int = 32
    chunks: int = 20
    endpoints: int = 8
    gateway_cpus: tuple[int, ...] | None = None
    client_cpus: tuple[int, ...] | None = None


@dataclass
class Window:
    """One measured window of one target in one round (module doc for the definitions)."""

    round: int
    target: str
    scenario: str
    ok: int = 0
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    events: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    delay_p99_ms: float | None = None
    gateway_cpu_s: float | None = None
    upstream_cpu_s: float | None = None
    machine_busy_s: float | None = None

    @property
    def units(self) -> int:
        """What the CPU is divided by: requests answered (non-streamed) or relayed events."""
        if self.scenario.startswith("json"):
            return self.ok + self.error_kinds.get("non-200", 0)
        return self.events

    def figures(self) -> dict[str, float | None]:
        """The derived figures of this window (µs, per second, percent)."""
        wall = self.wall_s or float("nan")
        return {
            "rps": self.ok / wall,
            "cpu_us": _div(self.gateway_cpu_s, self.units, 1e6),
            "gateway_core_pct": _div(self.gateway_cpu_s, wall, 100.0),
            "upstream_core_pct": _div(self.upstream_cpu_s, wall, 100.0),
            "machine_busy_cores": _div(self.machine_busy_s, wall, 1.0),
            "p50_ms": self.p50_ms, "p99_ms": self.p99_ms,
            "ttft_p50_ms": self.ttft_p50_ms, "ttft_p99_ms": self.ttft_p99_ms,
            "delay_p99_ms": self.delay_p99_ms,
        }


def _div(value: float | None, by: float, scale: float) -> float | None:
    return None if value is None or not by else value / by * scale


def percentile(values: Sequence[float], pct: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(len(ordered) * pct / 100.0)) - 1]


@dataclass
class Meter:
    """CPU counters read around a window: the gateway's, the stand-in's, the machine's."""

    gateway: Child | None
    upstream: Child
    start: tuple[float | None, float | None, float | None, float] = (None, None, None, 0.0)

    def begin(self) -> None:
        self.start = self._read()

    def end(self, window: Window) -> None:
        now = self._read()
        window.wall_s = now[3] - self.start[3]
        window.gateway_cpu_s, window.upstream_cpu_s, window.machine_busy_s = (
            None if b is None or a is None else a - b
            for a, b in zip(now[:3], self.start[:3], strict=True))

    def _read(self) -> tuple[float | None, float | None, float | None, float]:
        gateway = self.gateway.cpu_seconds() if self.gateway is not None else None
        return (gateway, self.upstream.cpu_seconds(), machine_busy_seconds(), time.monotonic())


@dataclass
class Bench:
    """Everything a run holds while it runs."""

    setup: OverheadSetup
    launch: Launch
    workdir: Path
    upstream: Child
    urls: list[str]
    scripts: Mapping[str, Path]
    command: str = ""
    started: str = field(default_factory=overhead_doc.now)
    windows: list[Window] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


async def measure_wrk(bench: Bench, meter: Meter, url: str, scenario: str,
                      window: Window) -> None:
    setup = bench.setup
    connections = setup.concurrency[1] if scenario == "json256" else setup.concurrency[0]
    script = bench.scripts["stream" if scenario == "burst32" else "json"]
    await wrk.run(url, script, connections, setup.warmup_s, cpus=setup.client_cpus)
    meter.begin()
    result = await wrk.run(url, script, connections, setup.seconds, cpus=setup.client_cpus)
    meter.end(window)
    window.ok, window.errors = result.ok, result.errors
    window.error_kinds = {"non-200": result.non200, "socket": result.socket_errors}
    window.p50_ms, window.p99_ms = result.p50_ms, result.p99_ms
    window.events = result.ok * (setup.chunks + 2) if scenario == "burst32" else 0


async def measure_paced(bench: Bench, meter: Meter, url: str, window: Window) -> None:
    setup = bench.setup
    paced = body(PACED_MODEL, stream=True)
    n = setup.stream_concurrency
    await stream_client.run_streams(url, paced, setup.chunks, n, min(setup.warmup_s, 0.5))
    meter.begin()
    result = await stream_client.run_streams(url, paced, setup.chunks, n, setup.paced_seconds)
    meter.end(window)
    _stream_figures(window, result)


def _stream_figures(window: Window, result: StreamResult) -> None:
    window.ok, window.errors = result.streams, result.error_count
    window.error_kinds = dict(result.errors)
    window.events = result.events
    window.ttft_p50_ms = percentile(result.ttft_ms, 50)
    window.ttft_p99_ms = percentile(result.ttft_ms, 99)
    window.p50_ms, window.p99_ms = window.ttft_p50_ms, window.ttft_p99_ms
    window.delay_p99_ms = percentile(result.delays_ms, 99)


async def run_target(bench: Bench, target: Gateway, round_no: int) -> list[Window]:
    """Start ``target``, run every scenario against it, stop it."""
    child: Child | None = None
    url = bench.urls[0]
    if target is not DIRECT:
        workdir = bench.workdir / f"round{round_no}-{target.key}"
        workdir.mkdir(parents=True, exist_ok=True)
        child = await gateways.start(target, bench.launch, bench.urls, workdir,
                                     bench.setup.gateway_cpus, START_TIMEOUT_S)
        url = child.url
    try:
        return [await _scenario(bench, child, url + "/v1/chat/completions", target, round_no, s)
                for s in SCENARIOS]
    finally:
        if child is not None:
            await child.stop()


async def _scenario(bench: Bench, child: Child | None, url: str, target: Gateway,
                    round_no: int, scenario: str) -> Window:
    window = Window(round_no, target.key, scenario)
    meter = Meter(child, bench.upstream)
    if scenario == "paced32":
        await measure_paced(bench, meter, url, window)
    else:
        await measure_wrk(bench, meter, url, scenario, window)
    figures = window.figures()
    print(f"  round {round_no + 1} {target.key:<10} {scenario:<8} ok {window.ok:>7} "
          f"errors {window.errors:>4} req/s {figures['rps']:>8.0f} "
          f"cpu µs {_fmt(figures['cpu_us'])} core % {_fmt(figures['gateway_core_pct'])}",
          flush=True)
    return window


def _fmt(value: float | None) -> str:
    return "     –" if value is None else f"{value:6.0f}"


def rotated(targets: Sequence[Gateway], round_no: int) -> list[Gateway]:
    """The targets in round ``round_no``'s order: rotated left by ``round_no``."""
    k = round_no % len(targets) if targets else 0
    return [*targets[k:], *targets[:k]]


async def run_rounds(bench: Bench, save: Path) -> None:
    for round_no in range(bench.setup.rounds):
        for target in rotated(bench.setup.targets, round_no):
            print(f"round {round_no + 1}/{bench.setup.rounds}: {target.label}", flush=True)
            try:
                bench.windows += await run_target(bench, target, round_no)
            except RuntimeError as exc:
                bench.notes.append(f"round {round_no}, {target.key}: {exc}".splitlines()[0])
                print(f"  {exc}", file=sys.stderr, flush=True)
            save.write_text(json.dumps(results(bench), indent=1) + "\n")


def summary(windows: Sequence[Window]) -> dict[str, dict[str, dict[str, Any]]]:
    """target → scenario → median of every figure over rounds, summed errors, added TTFT."""
    direct = {(w.round, w.scenario): w for w in windows if w.target == DIRECT.key}
    cells: dict[tuple[str, str], list[dict[str, float | None]]] = {}
    errors: dict[tuple[str, str], int] = {}
    for w in windows:
        figures = w.figures()
        base = direct.get((w.round, w.scenario))
        base_figures = base.figures() if base is not None else {}
        for pct in ("p50", "p99"):
            mine, theirs = figures[f"ttft_{pct}_ms"], base_figures.get(f"ttft_{pct}_ms")
            figures[f"added_ttft_{pct}_ms"] = None if mine is None or theirs is None \
                else mine - theirs
        cells.setdefault((w.target, w.scenario), []).append(figures)
        errors[(w.target, w.scenario)] = errors.get((w.target, w.scenario), 0) + w.errors
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (target, scenario), rows in cells.items():
        cell: dict[str, Any] = {k: _median([r[k] for r in rows]) for k in rows[0]}
        cell.update(errors=errors[(target, scenario)], rounds=len(rows))
        out.setdefault(target, {})[scenario] = cell
    return out


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def results(bench: Bench) -> dict[str, Any]:
    """What ``results.json`` holds: the run's facts, every window, and the summary."""
    facts = overhead_doc.meta(bench.setup, bench.launch, bench.notes, bench.command,
                              bench.started)
    return {"meta": facts,
            "windows": [{**asdict(w), **w.figures()} for w in bench.windows],
            "summary": summary(bench.windows)}


def portable_command(argv: Sequence[str]) -> str:
    """The command line as the doc shows it: without ``--out``/``--doc`` (and their values)
    and with the ``--ridge-src`` directory replaced by ``DIR`` (no paths of this machine)."""
    shown: list[str] = []
    args = iter(argv)
    for arg in args:
        name, eq, _ = arg.partition("=")
        if name in ("--out", "--doc", "--ridge-src"):
            if not eq:
                next(args, None)
            shown += ["--ridge-src", "DIR"] if name == "--ridge-src" else []
            continue
        shown.append(arg)
    return " ".join(["python -m ridge_bench.overhead", *(shlex.quote(a) for a in shown)])


def cores() -> tuple[tuple[int, ...] | None, tuple[int, ...] | None, str]:
    """(gateway cores, client cores, note): the first two usable cores when taskset exists."""
    usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(usable) < 2:
        return None, None, f"not pinned: {len(usable) or 'unknown'} usable core(s)"
    if shutil.which("taskset") is None:
        return None, None, "not pinned: taskset is not installed"
    return (usable[0],), (usable[1],), f"gateway on core {usable[0]}, stand-in and clients " \
                                       f"on core {usable[1]}"


async def execute(setup: OverheadSetup, launch: Launch, out: Path, notes: Sequence[str] = (),
                  command: str = "") -> dict[str, Any]:
    """The whole run (module doc); returns what ``results.json`` holds."""
    workdir = out / "logs"
    workdir.mkdir(parents=True, exist_ok=True)
    scripts = {"json": workdir / "json.lua", "stream": workdir / "stream.lua"}
    scripts["json"].write_text(wrk.script(body(MODEL, stream=False)))
    scripts["stream"].write_text(wrk.script(body(MODEL, stream=True)))
    upstream, urls = await start_upstream(workdir, setup.endpoints, setup.chunks, 30.0,
                                          setup.client_cpus)
    bench = Bench(setup, launch, workdir, upstream, urls, scripts, command, notes=list(notes))
    try:
        await run_rounds(bench, out / "results.json")
    finally:
        await upstream.stop()
    return results(bench)


SCENARIO_LABELS = {"json32": "non-streamed, 32 connections",
                   "json256": "non-streamed, 256 connections",
                   "burst32": "back-to-back streams, 32", "paced32": "paced streams, 32"}
PLOTS = {"cpu-request": (("json32", "json256"), "cpu_us", "gateway CPU per request [µs]"),
         "cpu-chunk": (("burst32", "paced32"), "cpu_us", "gateway CPU per relayed chunk [µs]"),
         "rps": (("json32", "json256", "burst32"), "rps", "requests answered per second")}
"""Plot name → (scenarios, figure of :meth:`Window.figures`, axis label): the bars of
:func:`draw_plots`."""


def draw_plots(data: Mapping[str, Any], section: str, directory: Path) -> list[Path]:
    """From a run's results (:func:`results`), per gateway (in the doc's order, then the
    rest; not the direct runs: no gateway, and the bare stand-in's req/s would dwarf the
    bars), bars of each scenario's median: CPU per request and per relayed chunk [µs],
    requests/s; ``overhead-SECTION-PLOT.png`` for each of :data:`PLOTS`; the paths written
    (a plot with no figure is left out)."""
    summary = {k: v for k, v in (data.get("summary") or {}).items() if k != DIRECT.key}
    targets = [t for t in overhead_doc.ORDER if t in summary] + \
        [t for t in summary if t not in overhead_doc.ORDER]
    drawn = []
    for name, (scenarios, figure, label) in PLOTS.items():
        values = {t: {SCENARIO_LABELS[s]: summary[t].get(s, {}).get(figure) for s in scenarios}
                  for t in targets if any(summary[t].get(s, {}).get(figure) is not None
                                          for s in scenarios)}
        drawn.append(plots.grouped_bars(
            values, directory / f"overhead-{plots.slug(section)}-{name}.png",
            f"overhead ({section}): {label.split(' [')[0]}, median over rounds", label,
            xlabel="gateway"))
    return [p for p in drawn if p is not None]


def _draw(data: Mapping[str, Any], section: str, directory: Path | None) -> None:
    if directory is not None:
        plots.draw_or_say(lambda: draw_plots(data, section, directory), "ridge bench overhead")


def _doc_path(value: str) -> Path | None:
    """``--doc``: a path, or None for '' (no doc)."""
    return Path(value) if value else None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ridge_bench.overhead",
                                description=__doc__.splitlines()[0])
    p.add_argument("--gateways", default=",".join(g.key for g in gateways.GATEWAYS),
                   help="comma-separated, of " + ", ".join(gateways.BY_KEY) + " (default: "
                        + ",".join(g.key for g in gateways.GATEWAYS) + ": with direct, eleven "
                        "targets of about 22 s a round each, so 13-16 minutes with 3 rounds)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=4.0, help="each wrk window (default 4)")
    p.add_argument("--paced-seconds", type=float, default=5.0, help="paced window (default 5)")
    p.add_argument("--ridge-src", type=Path,
                   help="run ridge from this source tree (e.g. a git worktree of an older "
                        "commit) instead of the installed one")
    p.add_argument("--section", default="current",
                   help="the doc block to write (default current; e.g. before)")
    p.add_argument("--title", help="the block's heading (default: from the ridge commit)")
    p.add_argument("--no-install", action="store_true",
                   help="skip each router (SGLang router, smg, vLLM router) that "
                        ".bench-venv/ does not already have at its pinned version")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results and logs")
    p.add_argument("--doc", type=_doc_path, default=DEFAULT_DOC,
                   help="'' to leave the doc alone")
    p.add_argument("--plots", metavar="DIR",
                   help="draw the plots into this folder (default: plots/ beside "
                        "results.json; '' for none)")
    p.add_argument("--from-results", type=Path,
                   help="run nothing: rewrite the doc and draw the plots from this file")
    return p


def setup_from(args: argparse.Namespace, notes: list[str]) -> tuple[OverheadSetup, Launch]:
    """The run's setup and launch; appends to ``notes`` what was left out and why."""
    keys = [k for k in args.gateways.split(",") if k]
    unknown = [k for k in keys if k not in gateways.BY_KEY]
    if unknown or args.rounds < 1 or args.seconds <= 0 or args.paced_seconds <= 0:
        raise ValueError(f"unknown gateways {unknown}" if unknown else "bad bounds")
    pythons = {}
    for kind in dict.fromkeys(gateways.BY_KEY[k].kind for k in keys):
        if kind not in gateways.ROUTERS:
            continue
        router = gateways.ROUTERS[kind]
        args.out.mkdir(parents=True, exist_ok=True)
        python, why = gateways.router_python(router, not args.no_install,
                                             args.out / f"{kind}-install.log")
        if python is None:
            notes.append(f"{router.name} skipped: {why}")
            keys = [k for k in keys if gateways.BY_KEY[k].kind != kind]
        else:
            pythons[kind] = python
    gw_cpus, client_cpus, pinning = cores()
    notes.append(pinning)
    setup = OverheadSetup((DIRECT, *(gateways.BY_KEY[k] for k in keys)), rounds=args.rounds,
                          seconds=args.seconds, paced_seconds=args.paced_seconds,
                          gateway_cpus=gw_cpus, client_cpus=client_cpus)
    launch = Launch(args.ridge_src.resolve() if args.ridge_src else None,
                    sglang_python=pythons.get("sglang"), smg_python=pythons.get("smg"),
                    vllm_router_python=pythons.get("vllm-router"))
    return setup, launch


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    if args.from_results is not None:
        saved = json.loads(args.from_results.read_text())
        if args.doc is not None:
            overhead_doc.write(args.doc, saved, args.section, args.title)
        _draw(saved, args.section, plots.plot_dir(args.plots, args.from_results.parent / "plots"))
        return 0
    if not wrk.available():
        print("ridge bench overhead: wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 2
    notes: list[str] = []
    try:
        setup, launch = setup_from(args, notes)
    except ValueError as exc:
        print(f"ridge bench overhead: {exc}", file=sys.stderr)
        return 2
    if setup.client_cpus is not None:
        os.sched_setaffinity(0, set(setup.client_cpus))
    out = args.out.resolve()
    data = _run(setup, launch, out, notes, portable_command(argv))
    if args.doc is not None:
        overhead_doc.write(args.doc, data, args.section, args.title)
        kept = args.doc.with_name(f"{args.doc.stem}-{args.section}.json")
        kept.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {args.doc} (section {args.section}), {kept} and {out / 'results.json'}")
    _draw(data, args.section, plots.plot_dir(args.plots, out / "plots"))
    return 0 if data["summary"] else 1


def _run(setup: OverheadSetup, launch: Launch, out: Path, notes: list[str],
         command: str) -> dict[str, Any]:
    holder: dict[str, Any] = {}

    async def go() -> None:
        holder.update(await execute(setup, launch, out, notes, command))

    with contextlib.suppress(KeyboardInterrupt):
        run_loop(go())
    if not holder:  # interrupted: what was saved so far
        saved = out / "results.json"
        holder.update(json.loads(saved.read_text()) if saved.exists() else {"summary": {}})
    return holder


if __name__ == "__main__":
    raise SystemExit(main())
