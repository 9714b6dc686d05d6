"""The capacity benchmark: a long multi-turn trace on 8 simulated GPUs, per fleet and router.

``python -m ridge_bench.capacity [--cells FLEET:ROUTER,...] [--trace FILE] [--speed 6]
[--seed 0] [--max-requests N] [--out DIR] [--doc docs/benchmarks/capacity.md]``.

Each cell replays the trace (default ``traces/long-sessions.jsonl``,
:mod:`ridge_bench.replay.sessions`) through one router of :data:`GATEWAYS` (``ridge``, or a
peer's cache_aware: ``sglang_ca``, ``smg_ca``, ``vllm_ca``) in front of one fleet of
:data:`FLEETS`, with the router comparison's cell runner
(:func:`ridge_bench.compare.benchmark.run_cell`). Per cell: the engines' prefix-cache hit rate
against two bounds from the trace (:mod:`ridge_bench.replay.bounds`), goodput, TTFT, the spread
over replicas and the gateway's memory, in simulated seconds. Results go to
``DIR/results.json`` after each cell; ``--doc`` rewrites the doc's generated block; the plots
(:func:`draw_plots`) go to ``--plots`` (default ``DIR/plots``), also from ``--from-results``.
See docs/benchmarks/capacity.md#the-capacity-benchmarks-run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from backends.engines.kv_capacity import engine_cache_tokens
from config.fleet import Fleet, load_fleet
from ridge_bench.capacity import doc as capacity_doc
from ridge_bench.command import Options
from ridge_bench.compare import benchmark as compare
from ridge_bench.harness import fleets, plots
from ridge_bench.harness.goodput import Slo
from ridge_bench.replay.bounds import lru_bound, unlimited_bound
from ridge_bench.replay.trace import TRACE, TRACES_DIR, load_trace, trace_workload

FLEETS: Mapping[str, Path] = MappingProxyType({
    name: fleets.ROOT / "deploy" / "bench" / f"capacity-{name}.yaml"
    for name in ("plain", "fp8", "host", "large-kv", "mix")})
GATEWAYS: Mapping[str, str] = MappingProxyType({
    "ridge": fleets.RIDGE,
    **{name: fleets.ROUTERS[name].gateway for name in ("sglang_ca", "smg_ca", "vllm_ca")}})
DEFAULT_CELLS = ("plain:ridge", "plain:sglang_ca", "plain:smg_ca", "plain:vllm_ca", "fp8:ridge",
                 "host:ridge", "large-kv:ridge", "large-kv:sglang_ca", "large-kv:smg_ca",
                 "large-kv:vllm_ca", "plain:ridge")
TRACE_FILE = TRACES_DIR / "long-sessions.jsonl"


@dataclass(frozen=True)
class Cell:
    """One run: a fleet (its name and file) behind a router of :data:`GATEWAYS`."""

    fleet: str
    router: str
    file: Path

    @property
    def name(self) -> str:
        return f"{self.fleet}:{self.router}"


def parse_cells(text: str, extra: Mapping[str, Path] | None = None) -> list[Cell]:
    """``FLEET:ROUTER,...`` over :data:`FLEETS` and ``extra`` fleets; ValueError naming the
    unknown ones."""
    known = {**FLEETS, **(extra or {})}
    cells = []
    for item in (s.strip() for s in text.split(",") if s.strip()):
        fleet, _, router = item.partition(":")
        if fleet not in known or router not in GATEWAYS:
            raise ValueError(f"unknown cell {item!r}: fleets {sorted(known)}, routers "
                             f"{sorted(GATEWAYS)}")
        cells.append(Cell(fleet, router, known[fleet]))
    return cells


def extra_fleets(specs: Sequence[str]) -> dict[str, Path]:
    """``NAME=FLEET_FILE`` items (``--extra-fleet``); ValueError for a malformed one."""
    out = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path or ":" in name:
            raise ValueError(f"--extra-fleet wants NAME=FLEET_FILE, got {spec!r}")
        out[name] = Path(path).resolve()
    return out


def fleet_capacity_tokens(fleet: Fleet) -> int:
    """KV tokens the whole fleet holds: device KV of every engine plus its host tier [tokens]
    (:func:`backends.engines.kv_capacity.engine_cache_tokens`; 0 for an engine whose KV is
    unknown)."""
    return sum((engine_cache_tokens(pool) or 0) * len(pool.endpoint_urls())
               for pool in fleet.pools)


def bounds(trace: Path, requests: int, fleet_files: Mapping[str, Path]
           ) -> dict[str, Any]:
    """The trace's bounds over its first ``requests`` requests (module doc)."""
    entries = load_trace(trace)[:requests]
    capacities = {name: fleet_capacity_tokens(load_fleet(path))
                  for name, path in fleet_files.items()}
    return {"unlimited": unlimited_bound(entries),
            "fleet_kv_tokens": capacities,
            "lru": {name: lru_bound(entries, cap) for name, cap in capacities.items()},
            "requests": len(entries),
            "prompt_tokens_mean": sum(e.input_length for e in entries) / len(entries),
            "span_s": (entries[-1].timestamp_ms - entries[0].timestamp_ms) / 1000}


def matrix(cells: Sequence[Cell], args: argparse.Namespace) -> compare.Matrix:
    """The comparison matrix whose one workload is the trace, one router per distinct cell."""
    replay = trace_workload(args.trace, args.seed, args.speed)
    requests = min(args.max_requests or len(replay.times_s), len(replay.times_s))
    span_s = replay.times_s[requests - 1] * args.speed + 1.0
    slo = Slo(args.slo_ttft, args.slo_tpot, args.slo_e2e)
    template = Options(workload=TRACE, url="", model=None, rate=0.0, steps=1,
                       requests=requests, duration_s=span_s, drain_s=args.slo_e2e, slo=slo,
                       seed=args.seed, progress=args.progress, replay=replay, speed=args.speed)
    routers = {c.name: fleets.Router(c.name, c.file, None, c.name, GATEWAYS[c.router])
               for c in cells}
    return compare.Matrix(routers, (TRACE,), {TRACE: len(replay.times_s) / span_s},
                          {TRACE: span_s}, template, Path(args.out),
                          command=" ".join(["python -m ridge_bench.capacity", *sys.argv[1:]]))


async def run(cells: Sequence[Cell], args: argparse.Namespace) -> dict[str, Any]:
    """Every cell in order (a repeated cell runs again); the results (meta and cells), saved
    after each cell."""
    m = matrix(cells, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    body: dict[str, Any] = {"meta": {**m.meta(), "trace": str(Path(args.trace).name),
                                     "bounds": bounds(Path(args.trace), m.template.requests,
                                                      {c.fleet: c.file for c in cells})},
                            "cells": []}
    stop = asyncio.Event()
    for index, cell in enumerate(cells):
        print(f"== {cell.name}", file=sys.stderr, flush=True)
        result = await compare.run_cell(m, cell.name, TRACE, stop)
        records = out / str(result.get("requests_file"))
        if records.is_file():  # kept apart: a repeated cell runs in the same folder
            kept = records.with_name(f"requests-{index + 1}.jsonl")
            records.replace(kept)
            result["requests_file"] = str(kept.relative_to(out))
        body["cells"].append({**result, "fleet": cell.fleet, "router": cell.router,
                              "fleet_file": str(cell.file)})
        (out / "results.json").write_text(json.dumps(body, indent=1) + "\n")
        await asyncio.sleep(compare.SETTLE_S)
    return body


def draw_plots(results: Mapping[str, Any], base: Path, directory: Path) -> list[Path]:
    """Each cell's plots, ``capacity-FLEET-ROUTER-PLOT.png`` (a repeated cell's with ``-2``
    …; :func:`ridge_bench.compare.benchmark.draw_cell`, records under ``base``), and every
    cell's hit rate against the trace's bounds, ``capacity-hit-rate.png``; the paths written."""
    drawn: list[Path] = []
    names: list[str] = []
    seen: dict[str, int] = {}
    for c in results["cells"]:
        name = f"{c['fleet']}:{c['router']}"
        n = seen[name] = seen.get(name, 0) + 1
        names.append(name if n == 1 else f"{name} ({n})")
        prefix = "capacity-" + plots.slug(name) + ("" if n == 1 else f"-{n}")
        drawn += compare.draw_cell(c, base, directory, prefix, names[-1])
    bounds = results["meta"]["bounds"]
    hit = {label: {"engine hit rate": (c.get("engine_prefix_cache") or {}).get("hit_rate"),
                   "LRU bound (fleet KV)": bounds["lru"].get(c["fleet"])}
           for label, c in zip(names, results["cells"], strict=True)}
    figure = plots.grouped_bars(hit, directory / "capacity-hit-rate.png",
                                "engine prefix-cache hit rate per cell, against the trace's "
                                "bounds", "prompt tokens served from cache [fraction]",
                                xlabel="fleet:router",
                                line=("unlimited shared cache", float(bounds["unlimited"])))
    return drawn + ([figure] if figure is not None else [])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ridge_bench.capacity",
                                description=__doc__.splitlines()[0])
    p.add_argument("--cells", default=",".join(DEFAULT_CELLS),
                   help="FLEET:ROUTER,... (a cell listed twice runs twice)")
    p.add_argument("--extra-fleet", action="append", default=[], metavar="NAME=FLEET_FILE",
                   help="another fleet for the cells (e.g. a routing variant)")
    p.add_argument("--trace", default=str(TRACE_FILE))
    p.add_argument("--speed", type=float, default=6.0, help="simulated time speed-up")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-requests", type=int, help="replay only the trace's first N requests")
    p.add_argument("--slo-ttft", type=float, default=2.0)
    p.add_argument("--slo-tpot", type=float, default=0.1)
    p.add_argument("--slo-e2e", type=float, default=60.0)
    p.add_argument("--out", default="bench-results/capacity")
    p.add_argument("--doc", help="rewrite the generated block of this markdown file")
    p.add_argument("--plots", metavar="DIR",
                   help="draw the plots into this folder (default: plots/ beside "
                        "results.json; '' for none)")
    p.add_argument("--from-results", metavar="RESULTS_JSON",
                   help="run nothing: rewrite --doc and draw the plots from a saved "
                        "results.json (and its cells' request records beside it)")
    p.add_argument("--progress", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    base = Path(args.from_results).parent if args.from_results else Path(args.out)
    if args.from_results:  # the bounds computed again: a pure function of the trace
        saved = json.loads(Path(args.from_results).read_text())
        meta = saved["meta"]
        meta["bounds"] = bounds(Path(args.trace), meta["requests"],
                                {c["fleet"]: Path(c.get("fleet_file") or FLEETS[c["fleet"]])
                                 for c in saved["cells"]})
    else:
        if args.speed <= 0:
            raise SystemExit("--speed must be positive")
        cells = parse_cells(args.cells, extra_fleets(args.extra_fleet))
        saved = asyncio.run(run(cells, args))
    if args.doc:
        capacity_doc.write(Path(args.doc), saved)
    where = plots.plot_dir(args.plots, base / "plots")
    if where is not None:
        plots.draw_or_say(lambda: draw_plots(saved, base, where), "python -m ridge_bench.capacity")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
