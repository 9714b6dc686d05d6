"""The overload benchmark: one pool pushed to a multiple of its capacity, admission control off
and on. ``ridge bench overload [--rates 1,1.5,2,2.5] [--factor 4] [--duration 60] ...``;
``ridge bench overload burst ...``: bursts on a mixed fleet (:mod:`ridge_bench.overload.burst`).

The fleet (``--fleet``, default ``deploy/bench/overload.yaml``) is one pool of two simulated
engines and its SLO; the workload unique prompts, Poisson arrivals, open loop; every run a
fresh simulator and ridge. First the **capacity**, admission off: the ``--rates`` in
increasing order until TTFT p99 exceeds the SLO or a request fails. Then the **overload**:
``--factor`` × the capacity, admission off and on.

Reported per run: requests sent, admitted and refused (at once, or after waiting), TTFT of the
admitted, time to refusal, goodput against the goodput at capacity, and what the engines held
(read every :data:`WATCH_S`). ``--speed`` compresses the simulator's time and the SLOs with it;
``--json FILE`` saves every run; :func:`draw_plots` draws them (again: ``--from-results``).
A measurement, not a test. See docs/benchmarks/overload.md#the-overload-benchmarks-run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from backends.engines.scrape import MetricsParseError, parse_samples
from config.fleet import Fleet, load_fleet
from ridge_bench.compare.benchmark import START_TIMEOUT_S, CpuMeter, start_sim
from ridge_bench.harness import engines, fleets, plots
from ridge_bench.harness.driver import Bounds, Destination, run_workload
from ridge_bench.harness.goodput import RequestResult, Slo, percentile, summarise, write_records
from ridge_bench.harness.procs import ROOT, Child, child_env, free_port, start_ridge
from ridge_bench.harness.workloads import CHAT, ChatSource, LoadStep, Workload

FLEET = ROOT / "deploy" / "bench" / "overload.yaml"
MODEL = "llama-3-8b"
REFUSED = "HTTP 503"
WATCH_S = 2.0
WAITED = "wait_expired"


@dataclass(frozen=True)
class OverloadSetup:
    """What to run (module docstring); token ranges are inclusive, times seconds."""

    fleet: Path = FLEET
    rates: tuple[float, ...] = (1.0, 1.5, 2.0, 2.5)
    factor: float = 4.0
    duration_s: float = 60.0
    drain_s: float = 30.0
    speed: float = 1.0
    seed: int = 0
    prompt_tokens: tuple[int, int] = (2300, 2500)
    max_tokens: tuple[int, int] = (64, 192)
    out: Path = Path("bench-results/overload")


@dataclass(frozen=True)
class Run:
    """One run's figures (module docstring). Times in seconds but ``refusal_*_ms``."""

    label: str
    admission: bool
    rate: float
    sent: int
    admitted: int
    refused: int
    failed: int
    ttft_p50: float | None
    ttft_p99: float | None
    refusal_p50_ms: float | None
    refusal_p99_ms: float | None
    goodput: float
    window_s: float
    refused_after_wait: int = 0
    engine_waiting: float | None = None
    engine_kv: float | None = None
    cpu: dict[str, Any] = field(default_factory=dict)
    requests_file: str | None = None
    """Where the run's request records are (:func:`ridge_bench.harness.goodput.record`)."""


def workload(setup: OverloadSetup, rate: float) -> Workload:
    """Unique long prompts at ``rate`` requests/s for the run's duration."""
    source = ChatSource(setup.seed, setup.prompt_tokens, setup.max_tokens)
    return Workload("overload", setup.seed, {CHAT: source}, {CHAT: 1.0},
                    (LoadStep(rate, setup.duration_s),))


def fleet_slo(raw: dict[str, Any], speed: float) -> Slo:
    """The fleet file's ``*`` SLO, in wall-clock seconds at ``speed``."""
    slo = raw["slos"]["*"]
    return Slo(slo["ttft_s"] / speed, slo["tpot_s"] / speed, slo["e2e_s"] / speed)


def render(setup: OverloadSetup, path: Path) -> Slo:
    """Write the fleet on free ports (its SLOs scaled to wall-clock time) to ``path``."""
    return render_fleet(setup.fleet, setup.speed, path)


def render_fleet(fleet: Path, speed: float, path: Path) -> Slo:
    """Write ``fleet`` on free ports to ``path``, its ``*`` SLO scaled to wall-clock time at
    ``speed``; that SLO."""
    raw = fleets.with_ports(yaml.safe_load(fleet.read_text()), free_port)
    slo = fleet_slo(raw, speed)
    raw["slos"]["*"] = {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "e2e_s": slo.e2e_s}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return slo


def row(label: str, admission: bool, rate: float, results: Sequence[RequestResult], slo: Slo,
        window_s: float) -> Run:
    """One run's figures from the client's results."""
    summary = summarise(results, slo, window_s)
    refusals = [r.e2e_s * 1e3 for r in results if r.error == REFUSED and r.e2e_s is not None]
    refused = sum(1 for r in results if r.error == REFUSED)
    return Run(label, admission, rate, summary.requests, summary.ok, refused,
               summary.requests - summary.ok - refused, summary.ttft_p50, summary.ttft_p99,
               percentile(refusals, 50), percentile(refusals, 99), summary.goodput, window_s)


@dataclass
class Watch:
    """The engines' figures, read every ``WATCH_S`` s: (seconds from the start, readings)."""

    fleet: Fleet
    readings: list[tuple[float, engines.Scrape]] = field(default_factory=list)

    async def run(self, clock: Any) -> None:
        start = clock()
        while True:
            self.readings.append((clock() - start, await engines.scrape(self.fleet)))
            await asyncio.sleep(WATCH_S)

    def means(self, window_s: float) -> tuple[float | None, float | None]:
        """Mean requests waiting per engine and mean KV cache used, within the window."""
        inside = [m for at, scrape in self.readings if at <= window_s for m in scrape.values()]
        waiting = [m.waiting for m in inside if m.waiting is not None]
        kv = [m.kv_cache_usage for m in inside if m.kv_cache_usage is not None]
        return (sum(waiting) / len(waiting) if waiting else None,
                sum(kv) / len(kv) if kv else None)


async def refusals_by_reason(url: str) -> dict[str, float]:
    """ridge's ``ridge_admission_rejected_total`` by reason (empty when it cannot be read)."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session, \
                session.get(url + "/metrics") as resp:
            text = await resp.text()
        samples = parse_samples(text, {"ridge_admission_rejected_total"})
    except (aiohttp.ClientError, TimeoutError, MetricsParseError):
        return {}
    out: dict[str, float] = {}
    for sample in samples:
        reason = sample.labels.get("reason", "")
        out[reason] = out.get(reason, 0.0) + sample.value
    return out


async def run_once(setup: OverloadSetup, label: str, rate: float, admission: bool) -> Run:
    """One run on a fresh simulator and ridge (module docstring)."""
    workdir = setup.out / label
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "fleet.yaml"
    slo = render(setup, config)
    sim = await start_sim(workdir, config, setup.speed, setup.seed)
    ridge: Child | None = None
    watch = Watch(load_fleet(config))
    try:
        env = child_env({"RIDGE_LOG_LEVEL": "warning",
                         "RIDGE_ADMISSION__ENABLED": "true" if admission else "false"})
        ridge = await start_ridge("ridge", workdir, config, env, START_TIMEOUT_S)
        meter = CpuMeter({"sim": sim, "ridge": ridge})
        meter.begin()
        watcher = asyncio.create_task(watch.run(asyncio.get_running_loop().time))
        data = await run_workload(workload(setup, rate), Destination(ridge.url, MODEL),
                                  Bounds(10**6, setup.duration_s, setup.drain_s))
        watcher.cancel()
        cpu = meter.end()
        reasons = await refusals_by_reason(ridge.url)
    finally:
        if ridge is not None:
            await ridge.stop()
        await sim.stop()
    run = row(label, admission, rate, data.results, slo, data.window_s)
    waiting, kv = watch.means(data.window_s)
    write_records(workdir / "requests.jsonl", data.results)
    return Run(**{**asdict(run), "cpu": cpu, "refused_after_wait": int(reasons.get(WAITED, 0)),
                  "engine_waiting": waiting, "engine_kv": kv,
                  "requests_file": str(workdir / "requests.jsonl")})


def within_slo(run: Run, slo: Slo) -> bool:
    """Every request answered and the TTFT p99 within the SLO."""
    return run.failed == 0 and run.refused == 0 and run.ttft_p99 is not None \
        and run.ttft_p99 <= slo.ttft_s


async def find_capacity(setup: OverloadSetup, slo: Slo) -> tuple[list[Run], Run | None]:
    """The capacity runs, admission off, and the last one within the SLO (None: none was)."""
    runs: list[Run] = []
    best: Run | None = None
    for rate in sorted(setup.rates):
        run = await run_once(setup, f"capacity-{rate:g}", rate, admission=False)
        print(line(run, best), flush=True)
        runs.append(run)
        if not within_slo(run, slo):
            break
        best = run
    return runs, best


async def overload(setup: OverloadSetup, capacity: Run) -> list[Run]:
    """``factor`` × the capacity, admission off then on."""
    rate = setup.factor * capacity.rate
    runs = []
    for admission in (False, True):
        label = f"overload-{'on' if admission else 'off'}"
        run = await run_once(setup, label, rate, admission)
        print(line(run, capacity), flush=True)
        runs.append(run)
    return runs


def _f(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


HEADER = ("| run | admission | offered [req/s] | sent | admitted | refused (503): at once "
          "+ after waiting | failed | admitted TTFT p50 / p99 [s] | refusal p50 / p99 [ms] "
          "| goodput [req/s] | of goodput at capacity | engine: waiting, KV used (means) |\n"
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def line(run: Run, capacity: Run | None) -> str:
    """``run`` as a row of :data:`HEADER`."""
    share = f"{100 * run.goodput / capacity.goodput:.0f} %" if capacity and capacity.goodput \
        else "–"
    refused = f"{run.refused - run.refused_after_wait} + {run.refused_after_wait}" \
        if run.refused else "0"
    kv = "–" if run.engine_kv is None else f"{100 * run.engine_kv:.0f} %"
    return (f"| {run.label} | {'on' if run.admission else 'off'} | {run.rate:g} | {run.sent} "
            f"| {run.admitted} | {refused} | {run.failed} "
            f"| {_f(run.ttft_p50)} / {_f(run.ttft_p99)} "
            f"| {_f(run.refusal_p50_ms, 1)} / {_f(run.refusal_p99_ms, 1)} "
            f"| {_f(run.goodput)} | {share} | {_f(run.engine_waiting, 1)}, {kv} |")


def table(runs: Sequence[Run], capacity: Run | None) -> str:
    return "\n".join([HEADER, *(line(r, capacity) for r in runs)])


async def execute(setup: OverloadSetup) -> tuple[list[Run], Run | None]:
    """Every run of the setup; the capacity run (None when no rate was within the SLO)."""
    setup.out.mkdir(parents=True, exist_ok=True)
    slo = fleet_slo(yaml.safe_load(setup.fleet.read_text()), setup.speed)
    print(HEADER, flush=True)
    runs, capacity = await find_capacity(setup, slo)
    if capacity is not None:
        runs += await overload(setup, capacity)
    return runs, capacity


def draw_plots(runs: Sequence[Run], slo: Slo, directory: Path) -> list[Path]:
    """TTFT p50/p99 against the offered rate, admission off and on
    (``overload-ttft-rate.png``); each run's requests answered, refused and failed
    (``overload-outcomes.png``); per run with its records, TTFT and TPOT over time and their
    CDFs, and the refusals over time (``overload-on-ttft-time.png``,
    ``overload-capacity-1.25-...``: the run's label, ``overload-`` once); the paths written."""
    points = [plots.RatePoint(f"admission {'on' if r.admission else 'off'}", r.rate, r.ttft_p50,
                              r.ttft_p99, r.sent, r.refused, r.failed, r.label) for r in runs]
    drawn = [plots.ttft_against_rate(points, slo.ttft_s, directory / "overload-ttft-rate.png",
                                     "overload"),
             plots.outcomes_per_run(points, directory / "overload-outcomes.png", "overload")]
    bounds = {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "e2e_s": slo.e2e_s}
    out = [p for p in drawn if p is not None]
    for r in runs:
        samples = plots.read_samples(Path(r.requests_file)) if r.requests_file else []
        out += plots.draw_requests(samples, bounds, directory,
                                   "overload-" + r.label.removeprefix("overload-"),
                                   f"{r.label} ({r.rate:g} req/s)")
    return out


def saved(path: Path) -> tuple[list[Run], Run | None, Slo]:
    """The runs, the capacity run and the SLO of a ``--json`` file (the SLO of files saved
    without it: the fleet file's at the saved speed)."""
    body = json.loads(path.read_text())
    runs = [Run(**r) for r in body["runs"]]
    capacity = next((r for r in runs if r.label == body.get("capacity")), None)
    if "slo" in body:
        slo = Slo(**body["slo"])
    else:
        plan = body["plan"]
        slo = fleet_slo(yaml.safe_load(Path(plan["fleet"]).read_text()), float(plan["speed"]))
    return runs, capacity, slo


def _pair(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    return int(low), int(high or low)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ridge bench overload",
                                description=(__doc__ or "").splitlines()[0])
    p.add_argument("--fleet", default=str(FLEET), help="one pool and its `*` SLO")
    p.add_argument("--rates", default="1,1.5,2,2.5", help="capacity search, requests/s")
    p.add_argument("--factor", type=float, default=4.0, help="overload: × the capacity")
    p.add_argument("--duration", type=float, default=60.0, help="arrival window per run [s]")
    p.add_argument("--drain", type=float, default=30.0, help="wait for answers after it [s]")
    p.add_argument("--speed", type=float, default=1.0, help="simulator time compression")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt-tokens", default="2300-2500", help="LOW-HIGH, per prompt")
    p.add_argument("--max-tokens", default="64-192", help="LOW-HIGH, per answer")
    p.add_argument("--out", default="bench-results/overload", help="logs and fleet files")
    p.add_argument("--json", help="also write every run as JSON to this file")
    p.add_argument("--plots", metavar="DIR",
                   help="draw the plots into this folder (default: OUT/plots; '' for none)")
    p.add_argument("--from-results", metavar="JSON",
                   help="run nothing: print the table and draw the plots from a saved --json "
                        "file (and the request records it names)")
    return p


def setup_of(args: argparse.Namespace) -> OverloadSetup:
    rates = tuple(float(r) for r in args.rates.split(",") if r)
    if not rates or min(rates) <= 0 or args.factor <= 0 or args.duration <= 0 \
            or args.speed <= 0:
        raise ValueError("rates, --factor, --duration and --speed must be positive")
    return OverloadSetup(Path(args.fleet), rates, args.factor, args.duration, args.drain,
                         args.speed, args.seed, _pair(args.prompt_tokens),
                         _pair(args.max_tokens), Path(args.out))


def _draw(runs: Sequence[Run], slo: Slo, directory: Path | None) -> None:
    if directory is not None:
        plots.draw_or_say(lambda: draw_plots(runs, slo, directory), "ridge bench overload")


def main(argv: Sequence[str] | None = None) -> int:
    """``ridge bench overload``; ``ridge bench overload burst ...`` runs
    :mod:`ridge_bench.overload.burst`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["burst"]:
        from ridge_bench.overload import burst

        return burst.main(argv[1:])
    args = parser().parse_args(argv)
    try:
        setup = setup_of(args)
    except ValueError as exc:
        print(f"ridge bench overload: {exc}", file=sys.stderr)
        return 2
    where = plots.plot_dir(args.plots, setup.out / "plots")
    if args.from_results:
        runs, capacity, slo = saved(Path(args.from_results))
        print(table(runs, capacity))
        _draw(runs, slo, where)
        return 0
    runs, capacity = asyncio.run(execute(setup))
    print("\n" + table(runs, capacity))
    if capacity is None:
        print("no rate was within the SLO: lower --rates", file=sys.stderr)
    slo = fleet_slo(yaml.safe_load(setup.fleet.read_text()), setup.speed)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"plan": {k: str(v) for k, v in asdict(setup).items()},
             "capacity": capacity.label if capacity else None,
             "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "e2e_s": slo.e2e_s},
             "runs": [asdict(r) for r in runs]}, indent=1) + "\n")
    _draw(runs, slo, where)
    return 0 if capacity is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
