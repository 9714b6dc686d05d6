"""The router comparison: every router × every workload on the same simulated GPUs.

``python -m ridge_bench.compare [--workloads ...] [--routers ...] [--requests N] [--duration S]
[--rate W=RPS ...] [--tokenizer DIR [--kv-events]] [--out DIR] [--doc FILE]``.

Each cell (router, workload) shares nothing with another (:func:`run_cell`): it renders the
router's fleet on free ports (:mod:`ridge_bench.harness.fleets`), starts the simulator and the
router's gateway (ridge, or a peer: the SGLang router, smg or vLLM's router, pinned in
``.bench-venv/``, :func:`start_peer`), runs the workload in this process
(:func:`ridge_bench.command.execute`), reads every process's CPU and the gateway's memory, and
stops both, whatever happened. ``--speed S`` runs the simulator S times faster, with ridge's
time settings divided by S (:data:`TIME_SETTINGS`); a process over
:data:`SATURATED_CORE_FRACTION` of a core is flagged.

Results go to ``DIR/results.json`` after every cell; ``--doc`` (or ``--from-results``) rewrites
the doc's generated part (:mod:`ridge_bench.compare.doc`) and :func:`draw_plots` draws them.
Ctrl-C stops the current cell cleanly. See docs/benchmarks/router.md#the-comparisons-cells.
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
from types import MappingProxyType
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from config.fleet import Fleet
from gateway.settings import AdmissionSettings, RegistrySettings, StateSettings
from ridge_bench.command import DEFAULT_RATES, Options, execute
from ridge_bench.compare import doc as compare_doc
from ridge_bench.compare.report import report_dict, text
from ridge_bench.harness import fleets, gateways, plots
from ridge_bench.harness.goodput import Slo
from ridge_bench.harness.procs import (
    ROOT,
    Child,
    child_env,
    free_port,
    machine_busy_seconds,
    start_ridge,
)
from ridge_bench.harness.workloads import NAMES

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
    out: Path
    command: str = ""
    extras: fleets.Extras = fleets.Extras()

    @property
    def speed(self) -> float:
        """The simulator's speed-up, the template's (:attr:`Options.speed`)."""
        return self.template.speed

    def meta(self) -> dict[str, Any]:
        """The settings every cell shared (:func:`ridge_bench.compare.doc.meta`) and the fleet
        extras (:meth:`ridge_bench.harness.fleets.Extras.meta`)."""
        return {**compare_doc.meta(self.template, self.rates, self.durations, self.speed,
                                   self.command), **self.extras.meta()}


TIME_SETTINGS: Mapping[str, tuple[type[BaseModel], str]] = MappingProxyType({
    "RIDGE_REGISTRY__POLL_INTERVAL_S": (RegistrySettings, "poll_interval_s"),
    "RIDGE_STATE__PREFIX_MAX_AGE_S": (StateSettings, "prefix_max_age_s"),
    "RIDGE_STATE__SESSION_MAX_AGE_S": (StateSettings, "session_max_age_s"),
    "RIDGE_ADMISSION__MAX_WAIT_S": (AdmissionSettings, "max_wait_s"),
    "RIDGE_ADMISSION__CEILING_TTL_S": (AdmissionSettings, "ceiling_ttl_s"),
})
"""ridge's settings that are spans of time the routing depends on (how stale the engines'
load is, how long a prefix or a session is remembered, how long a request may queue), by the
environment variable that sets them: with the simulator at ``--speed`` S they are set to their
default ÷ S, so ridge sees the same simulated spans as at speed 1."""


def _env(speed: float = 1.0) -> dict[str, str]:
    # no access log: ridge's CPU goes to routing
    return child_env({"RIDGE_LOG_LEVEL": "warning", **ridge_time_env(speed)})


def ridge_time_env(speed: float) -> dict[str, str]:
    """:data:`TIME_SETTINGS` at their defaults ÷ ``speed`` (none at speed 1)."""
    if speed == 1.0:
        return {}
    out = {}
    for var, (model, name) in TIME_SETTINGS.items():
        default = model.model_fields[name].default
        out[var] = repr(float(default) / speed)
    return out


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


def peak_rss_mb(pid: int) -> float | None:
    """The peak resident memory of process ``pid`` so far [MB = 2^20 B]: ``VmHWM`` of
    ``/proc/<pid>/status`` (kB); None if unavailable (not Linux, or the process is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


def sample_sums(exposition: str, names: Sequence[str]) -> dict[str, float]:
    """Each sample of ``names`` present in a Prometheus text ``exposition``, summed over its
    label sets (one parse)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name in names:
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


CELL_COUNTERS: Mapping[str, str] = MappingProxyType({
    "kv_events_applied": "ridge_kv_events_total",
    "prefix_predicted_tokens": "ridge_prefix_predicted_tokens_total",
    "prefix_lost_tokens": "ridge_prefix_lost_tokens_total"})
"""A cell's figure → ridge's counter, summed over its label sets: the KV-cache events it
applied (:mod:`gateway.fleet.kv_events`), the prompt tokens its index predicted cached on the
endpoint it chose, and of those the tokens the engine recomputed
(:mod:`gateway.telemetry.prometheus`)."""


async def ridge_metrics(url: str) -> str:
    """ridge's ``GET /metrics`` at ``url`` (empty if it fails)."""
    timeout = aiohttp.ClientTimeout(total=10.0)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session, \
                session.get(url + "/metrics") as resp:
            return await resp.text() if resp.status == 200 else ""
    except (aiohttp.ClientError, TimeoutError):
        return ""


def ridge_figures(exposition: str) -> dict[str, Any]:
    """From ridge's ``/metrics``, each summed over its label sets: the gauges of
    :data:`ridge_bench.compare.doc.INDEX_GAUGES` present [B], and the figures of
    :data:`CELL_COUNTERS` (None for a counter that is absent)."""
    sums = sample_sums(exposition, (*compare_doc.INDEX_GAUGES, *CELL_COUNTERS.values()))
    counted = {key: sums.pop(name, None) for key, name in CELL_COUNTERS.items()}
    return {**sums, **counted}


async def start_peer(kind: str, policy: str, workdir: Path, fleet: Fleet, model: str) -> Child:
    """The Rust router of ``kind`` with ``policy`` over every endpoint of ``fleet``
    (:func:`ridge_bench.harness.gateways.peer`, installed at its pin on first use), answering
    a chat completion for ``model``, or RuntimeError (not installable, or not answering: with
    its log). smg gets no alias workers: the fleet's engines list the one model it routes."""
    router = gateways.ROUTERS[kind]
    python, why = gateways.router_python(router, install=True,
                                         log=workdir / f"{kind}-install.log")
    if python is None:
        raise RuntimeError(f"the {router.name} ({router.requirement}) is unavailable: {why}")
    urls = [u for pool in fleet.pools for u in pool.endpoint_urls()]
    return await gateways.start(gateways.peer(kind, policy),
                                gateways.Launch().with_python(kind, python), urls, workdir,
                                None, START_TIMEOUT_S, model, smg_alias=None)


def cell_model(router: fleets.Router, fleet: Fleet) -> str | None:
    """The model every request of the cell names: for a peer, the fleet's first model (the
    SGLang router's ``/v1/models`` lists ``unknown`` for workers it found no model name on);
    for ridge None, the first model ridge lists."""
    return None if router.peer is None else fleet.pools[0].models[0]


async def start_gateway(router: fleets.Router, workdir: Path, config: Path, opts: Options
                        ) -> Child:
    """The router's gateway in front of ``opts.fleet``, written to ``config`` (module doc,
    step 2); a peer is probed with ``opts.model``."""
    if router.peer is None:
        return await start_ridge("ridge", workdir, config, _env(opts.speed), START_TIMEOUT_S)
    assert opts.fleet is not None and opts.model is not None
    return await start_peer(*router.peer, workdir, opts.fleet, opts.model)


async def gateway_figures(gateway: Child) -> dict[str, Any]:
    """The running gateway's peak RSS [MB] and, for ridge, :func:`ridge_figures`."""
    out: dict[str, Any] = {"gateway_peak_rss_mb": peak_rss_mb(gateway.proc.pid)}
    if gateway.name == "ridge":
        out.update(ridge_figures(await ridge_metrics(gateway.url)))
    return out


async def run_cell(matrix: Matrix, router_name: str, workload: str,
                   stop: asyncio.Event) -> dict[str, Any]:
    """One cell, started and torn down (module doc); its report as JSON values."""
    router = matrix.routers[router_name]
    workdir = matrix.out / f"{workload}-{router_name}"
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "fleet.yaml"
    fleet = fleets.render(router, config, free_port, matrix.extras)
    opts = replace(matrix.template, workload=workload, rate=matrix.rates[workload],
                   duration_s=matrix.durations[workload], fleet=fleet,
                   model=matrix.template.model or cell_model(router, fleet),
                   requests_out=workdir / "requests.jsonl")
    sim = await start_sim(workdir, config, matrix.speed, opts.seed)
    gateway: Child | None = None
    try:
        gateway = await start_gateway(router, workdir, config, opts)
        meter = CpuMeter({"sim": sim, gateway.name: gateway})
        meter.begin()
        report = await execute(replace(opts, url=gateway.url), stop,
                               {"router": router_name, "fleet": router.fleet.name,
                                "gateway": router.gateway})
        cpu = meter.end()
        figures = await gateway_figures(gateway)
    finally:
        if gateway is not None:
            await gateway.stop()
        await sim.stop()
    print(text(report), flush=True)
    return {**report_dict(report), "cpu": cpu, **figures,
            "saturated": saturated(cpu, report.client_cpu_s),
            "requests_file": str(opts.requests_out.relative_to(matrix.out))
            if opts.requests_out is not None else None}


def _save(out: Path, results: list[dict[str, Any]], matrix: Matrix) -> None:
    body = {"meta": matrix.meta(), "cells": results}
    (out / "results.json").write_text(json.dumps(body, indent=1) + "\n")


def draw_cell(cell: Mapping[str, Any], base: Path, directory: Path, prefix: str,
              title: str) -> list[Path]:
    """One cell's plots (:func:`ridge_bench.harness.plots.draw_run`) from its saved report and
    its requests' records, ``base / cell["requests_file"]`` (none: only the report's plots)."""
    records = cell.get("requests_file")
    samples = plots.read_samples(base / records) if records else []
    return plots.draw_run(cell, samples, directory, prefix, title)


def draw_plots(cells: Sequence[Mapping[str, Any]], base: Path, directory: Path) -> list[Path]:
    """Each cell's plots, ``router-WORKLOAD-ROUTER-PLOT.png`` (:func:`draw_cell`, records under
    ``base``), and every cell's goodput, ``router-goodput.png``; the paths written."""
    drawn: list[Path] = []
    for c in cells:
        drawn += draw_cell(c, base, directory, f"router-{c['workload']}-{c['router']}",
                           f"{c['workload']} × {c['router']}")
    goodput: dict[str, dict[str, float | None]] = {}
    for c in cells:
        goodput.setdefault(c["workload"], {})[c["router"]] = c["summary"]["goodput_rps"]
    matrix = plots.grouped_bars(goodput, directory / "router-goodput.png",
                                "goodput per workload and router",
                                "goodput [req/s meeting every SLO]", xlabel="workload")
    return drawn + ([matrix] if matrix is not None else [])


async def run_matrix(matrix: Matrix, doc: Path | None, plot_dir: Path | None = None) -> int:
    """Every cell in order; results saved after each; the doc rewritten and the plots drawn
    (into ``plot_dir``, when given) at the end."""
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
    if plot_dir is not None:
        plots.draw_or_say(lambda: draw_plots(results, matrix.out, plot_dir), PROG)
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


PROG = "python -m ridge_bench.compare"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG,
                                description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default=",".join(NAMES))
    p.add_argument("--routers", default=",".join(n for n, r in fleets.ROUTERS.items()
                                                 if r.peer is None),
                   help="default: every router run by ridge (add the peers: "
                        + ", ".join(n for n, r in fleets.ROUTERS.items() if r.peer) + ")")
    p.add_argument("--extra-router", action="append", default=[],
                   metavar="NAME=FLEET_FILE[@KIND:POLICY]",
                   help="also run this fleet file (added to --routers as NAME): behind ridge "
                        "with its own routing, or behind the Rust router KIND "
                        f"({', '.join(gateways.ROUTERS)}) with POLICY "
                        f"({', '.join(fleets.PEER_POLICIES)}) over all its endpoints")
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
    p.add_argument("--tokenizer", metavar="MODEL_DIR",
                   help="count every model's prompt tokens with this Hugging Face model "
                        "folder's tokenizer (tokenizer.json, tokenizer_config.json), in the "
                        "simulator and in ridge")
    p.add_argument("--kv-events", action="store_true",
                   help="every prefix-caching pool publishes KV-cache events, which ridge "
                        "follows (needs --tokenizer)")
    p.add_argument("--out", default="bench-results/router", help="results directory")
    p.add_argument("--doc", help="rewrite the generated part of this markdown file")
    p.add_argument("--progress", action="store_true", help="progress bar per cell")
    p.add_argument("--plots", metavar="DIR",
                   help="draw the plots into this folder (default: plots/ beside "
                        "results.json; '' for none)")
    p.add_argument("--from-results", metavar="RESULTS_JSON", action="append",
                   help="run nothing: rewrite --doc (if given) and draw the plots from a saved "
                        "results.json and its cells' request records; repeated, a later file's "
                        "cells replace the earlier ones of the same workload and router (runs "
                        "with the same settings but their rates)")
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line, parsed; an argparse error (exit 2) for ``--kv-events`` without
    ``--tokenizer`` or a ``--tokenizer`` folder without ``tokenizer.json``."""
    p = parser()
    args = p.parse_args(argv)
    if args.kv_events and not args.tokenizer:
        p.error("--kv-events needs --tokenizer: the simulated engines' KV-cache events carry "
                "the model's token ids")
    if args.tokenizer and not (Path(args.tokenizer) / "tokenizer.json").is_file():
        p.error(f"--tokenizer {args.tokenizer}: no tokenizer.json in that folder")
    return args


def extras_of(args: argparse.Namespace) -> fleets.Extras:
    """The fleet extras the command line asks for."""
    tokenizer = Path(args.tokenizer).resolve() if args.tokenizer else None
    return fleets.Extras(tokenizer, args.kv_events)


def matrix_of(args: argparse.Namespace) -> Matrix:
    known = dict(fleets.ROUTERS)
    for spec in args.extra_router:
        try:
            extra = fleets.custom_router(spec)
        except ValueError as exc:
            raise SystemExit(f"--extra-router: {exc}") from None
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
        progress=args.progress, speed=args.speed,
    )
    routers = {name: known[name] for name in names}
    rates = per_workload(args.rate, DEFAULT_RATES, "--rate")
    durations = per_workload(args.duration, dict.fromkeys(NAMES, 60.0), "--duration")
    return Matrix(routers, workloads, rates, durations, template, Path(args.out),
                  extras=extras_of(args))


def command_line(argv: Sequence[str]) -> str:
    """How this run was started, to print in the doc."""
    return " ".join([PROG, *(shlex.quote(a) for a in argv)])


def saved_cells(path: Path) -> dict[str, Any]:
    """A saved ``results.json``, each cell's ``requests_file`` made absolute (relative to the
    file's folder; cells saved before the key get their cell folder's ``requests.jsonl``)."""
    run = json.loads(path.read_text())
    for c in run["cells"]:
        records = c.get("requests_file") or f"{c['workload']}-{c['router']}/requests.jsonl"
        c["requests_file"] = str((path.parent / records).resolve())
    return dict(run)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.from_results:
        runs = [saved_cells(Path(f)) for f in args.from_results]
        try:
            cells, m = compare_doc.merged(runs)
        except ValueError as exc:
            raise SystemExit(f"--from-results: {exc}") from None
        if args.doc:
            compare_doc.write_doc(Path(args.doc), compare_doc.markdown(cells, m))
        where = plots.plot_dir(args.plots, Path(args.from_results[-1]).parent / "plots")
        if where is not None:
            plots.draw_or_say(lambda: draw_plots(cells, Path.cwd(), where), PROG)  # absolute
        return 0
    matrix = replace(matrix_of(args), command=command_line(argv))
    return asyncio.run(run_matrix(matrix, Path(args.doc) if args.doc else None,
                                  plots.plot_dir(args.plots, matrix.out / "plots")))


if __name__ == "__main__":
    raise SystemExit(main())
