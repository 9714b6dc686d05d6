"""The precise-routing run: each router in turn in front of the same two real vLLM engines.

``python -m ridge_bench.precise [--seed 0] [--rate 0.7] [--duration 180] [--requests 126]
[--drain 120] [--blocks 24] [--routers ridge,ridge-open,vllm-kv,vllm-rr] [--out DIR]
[--doc FILE]``;
``--from-results FILE`` rewrites the doc from a saved run.

The engines start once (:mod:`ridge_bench.precise.engines`). For each router
(:mod:`ridge_bench.precise.contenders`): start it, wait :data:`SETTLE_S` (its event
subscriptions connect), scrape the engines' counters, replay the workload
(:mod:`ridge_bench.precise.workload`) open loop through it
(:func:`ridge_bench.harness.driver.run_workload`: same requests, same seeds), scrape again,
stop it and empty the engines' prefix caches. The engines' own counters give the hit rate
per engine and overall (:mod:`ridge_bench.harness.engines`); the client gives TTFT and
errors. A router that cannot start is reported with its error and the run goes on. Results
go to ``DIR/results.json`` (after every router) and per-request records to
``DIR/ROUTER-requests.jsonl``; the doc's generated block is :mod:`ridge_bench.precise.doc`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from backends.launch.real_fleet import RealFleet, engine_paths, engines_dir
from config.fleet import Fleet, parse_fleet
from ridge_bench.compare.benchmark import ridge_figures, ridge_metrics
from ridge_bench.compare.report import build_report, report_dict
from ridge_bench.harness import engines as engine_counters
from ridge_bench.harness import gateways
from ridge_bench.harness.driver import Bounds, Destination, RunData, run_workload
from ridge_bench.harness.fleets import distinct
from ridge_bench.harness.goodput import Slo, write_records
from ridge_bench.harness.procs import ROOT, Child, free_port, start_ridge
from ridge_bench.harness.progress import Progress
from ridge_bench.harness.workloads import Workload, theoretical_f
from ridge_bench.overhead.doc import machine, now, ridge_version
from ridge_bench.precise import doc as precise_doc
from ridge_bench.precise.contenders import (
    CONTENDERS,
    VLLM_ROUTER,
    Contender,
    decision_outcomes,
    ridge_fleet,
    router_args,
)
from ridge_bench.precise.engines import (
    BLOCK_TOKENS,
    demo_pool,
    engine_pool,
    engine_version,
    reset_prefix_caches,
    start_engines,
)
from ridge_bench.precise.workload import shared_prefix_workload

DOC = ROOT / "docs" / "benchmarks" / "precise.md"
SLO = Slo(ttft_s=2.0, tpot_s=0.25, e2e_s=15.0)
"""For the goodput figures of the results file only; the page reports hit rate and TTFT."""
SETTLE_S = 3.0
START_TIMEOUT_S = 120.0
ENGINE_START_TRIES = 3


@dataclass(frozen=True)
class PreciseSetup:
    """One run as the command line describes it (module doc)."""

    seed: int = 0
    rate: float = 0.7
    duration_s: float = 180.0
    requests: int = 126
    drain_s: float = 120.0
    blocks: int = 24
    routers: tuple[str, ...] = tuple(CONTENDERS)
    engine_start_s: float = 300.0

    def command(self) -> str:
        """The command line that repeats this run (no paths)."""
        return (f"python -m ridge_bench.precise --seed {self.seed} --rate {self.rate:g} "
                f"--duration {self.duration_s:g} --requests {self.requests} "
                f"--drain {self.drain_s:g} --blocks {self.blocks} "
                f"--routers {','.join(self.routers)}")


def meta(setup: PreciseSetup, workload: Workload, fleet: Fleet) -> dict[str, Any]:
    """The run's facts for the results file and the doc."""
    return {
        "date": now(), "command": setup.command(), "ridge": ridge_version(ROOT),
        "machine": machine(), "seed": setup.seed, "rate_rps": setup.rate,
        "duration_s": setup.duration_s, "requests": setup.requests, "drain_s": setup.drain_s,
        "kv_blocks": setup.blocks, "block_tokens": BLOCK_TOKENS,
        "endpoints": fleet.pools[0].endpoint_urls(), "f_theory": theoretical_f(workload),
        "vllm_router": VLLM_ROUTER.version,
    }


async def start_contender(contender: Contender, raw_pool: Mapping[str, Any], fleet: Fleet,
                          workdir: Path) -> Child:
    """``contender`` running in front of the engines, or RuntimeError saying why not."""
    pool = fleet.pools[0]
    if contender.kind == "ridge":
        config = workdir / "ridge-fleet.yaml"
        tokenizer = Path(engine_paths(engines_dir())[1]).resolve()
        config.write_text(yaml.safe_dump(ridge_fleet(raw_pool, tokenizer), sort_keys=False))
        return await start_ridge(contender.key, workdir, config, contender.env,
                                 START_TIMEOUT_S)
    python, why = gateways.router_python(VLLM_ROUTER, install=False,
                                         log=workdir / "install.log")
    if python is None:
        raise RuntimeError(why)
    gateway = gateways.Gateway(contender.key, contender.label, contender.kind, contender.policy)
    return await gateways.start(gateway, gateways.Launch(vllm_router_python=python),
                                pool.endpoint_urls(), workdir, None, START_TIMEOUT_S,
                                pool.models[0], smg_alias=None,
                                router_args=router_args(contender, pool))


async def contender_figures(contender: Contender, child: Child) -> dict[str, Any]:
    """What the router says of its own routing: ridge's KV-event and prediction counters,
    ``kv_aware``'s decision outcomes from its log."""
    if contender.kind == "ridge":
        return {"ridge": ridge_figures(await ridge_metrics(child.url))}
    if contender.policy == "kv_aware":
        return {"kv_decisions": decision_outcomes(child.log_path.read_text(errors="replace"))}
    return {}


async def drive(setup: PreciseSetup, workload: Workload, fleet: Fleet, url: str,
                label: str) -> tuple[RunData, engine_counters.FleetCacheUse]:
    """The workload through ``url`` and the engines' counters over it."""
    before = await engine_counters.scrape(fleet)
    data = await run_workload(
        workload, Destination(url, fleet.pools[0].models[0]),
        Bounds(setup.requests, setup.duration_s, setup.drain_s),
        progress=Progress(label, setup.requests, setup.duration_s))
    return data, engine_counters.cache_use(fleet, before, await engine_counters.scrape(fleet))


async def run_contender(contender: Contender, setup: PreciseSetup, raw_pool: Mapping[str, Any],
                        fleet: Fleet, workload: Workload, workdir: Path) -> dict[str, Any]:
    """One router's row of the results (module doc)."""
    head = {"key": contender.key, "label": contender.label}
    try:
        child = await start_contender(contender, raw_pool, fleet, workdir)
    except RuntimeError as exc:
        return {**head, "error": str(exc)}
    try:
        await asyncio.sleep(SETTLE_S)
        data, cache = await drive(setup, workload, fleet, child.url, contender.key)
        figures = await contender_figures(contender, child)
    finally:
        await child.stop()
    write_records(workdir / f"{contender.key}-requests.jsonl", data.results)
    report = build_report(workload, data, SLO, theoretical_f(workload), cache)
    return {**head, **report_dict(report), **figures}


async def start_pair(setup: PreciseSetup, workdir: Path
                     ) -> tuple[dict[str, Any], Fleet, RealFleet]:
    """The engine pair on fresh ports: its raw pool, its fleet and its processes. A port
    free when chosen can be taken by the time an engine binds it (vLLM picks ports of its own
    for its internal sockets meanwhile), so a failed start is tried again on new ports, up
    to :data:`ENGINE_START_TRIES` times."""
    for attempt in range(1, ENGINE_START_TRIES + 1):
        raw_pool = engine_pool(demo_pool(), distinct(free_port), setup.blocks)
        fleet = parse_fleet({"pools": [raw_pool]}, source="precise-routing engines")
        try:
            return raw_pool, fleet, await start_engines(fleet.pools[0], workdir,
                                                        setup.engine_start_s)
        except RuntimeError as exc:
            if attempt == ENGINE_START_TRIES:
                raise
            print(f"engines did not start ({str(exc).splitlines()[0]}); again on new ports",
                  file=sys.stderr)
    raise AssertionError("unreachable")


async def run(setup: PreciseSetup, workdir: Path) -> dict[str, Any]:
    """Every router of ``setup`` in turn; the results (saved after each router)."""
    raw_pool, fleet, running = await start_pair(setup, workdir)
    workload = shared_prefix_workload(setup.seed, setup.rate, setup.duration_s)
    payload: dict[str, Any] = {"meta": meta(setup, workload, fleet), "results": []}
    try:
        payload["meta"]["vllm"] = await engine_version(fleet.pools[0].endpoint_urls()[0])
        for key in setup.routers:
            row = await run_contender(CONTENDERS[key], setup, raw_pool, fleet, workload, workdir)
            payload["results"].append(row)
            save(workdir / "results.json", payload)
            await reset_prefix_caches(fleet.pools[0].endpoint_urls())
    finally:
        await running.stop()
    return payload


def save(path: Path, payload: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=2) + "\n")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ridge_bench.precise", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    d = PreciseSetup()
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--rate", type=float, default=d.rate, help="requests/s (Poisson)")
    p.add_argument("--duration", type=float, default=d.duration_s, help="seconds of arrivals")
    p.add_argument("--requests", type=int, default=d.requests, help="at most this many")
    p.add_argument("--drain", type=float, default=d.drain_s, help="seconds to finish")
    p.add_argument("--blocks", type=int, default=d.blocks, help="KV blocks per engine")
    p.add_argument("--routers", default=",".join(d.routers),
                   help=f"comma-separated, of {', '.join(CONTENDERS)}")
    p.add_argument("--out", type=Path, default=None, help="results folder (default: a temp one)")
    p.add_argument("--doc", default=str(DOC), help="doc to rewrite ('' for none)")
    p.add_argument("--from-results", type=Path, default=None,
                   help="rewrite the doc from this results.json instead of running")
    return p


def setup_of(args: argparse.Namespace) -> PreciseSetup:
    routers = tuple(r for r in args.routers.split(",") if r)
    unknown = [r for r in routers if r not in CONTENDERS]
    if unknown or not routers:
        raise SystemExit(f"unknown routers {unknown}; known: {', '.join(CONTENDERS)}")
    return PreciseSetup(args.seed, args.rate, args.duration, args.requests, args.drain,
                        args.blocks, routers)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.from_results is not None:
        payload = json.loads(args.from_results.read_text())
    else:
        out = args.out or Path(tempfile.mkdtemp(prefix="ridge-precise-"))
        out.mkdir(parents=True, exist_ok=True)
        payload = asyncio.run(run(setup_of(args), out))
        print(f"results: {out / 'results.json'}", file=sys.stderr)
    print(precise_doc.markdown(payload))
    if args.doc:
        precise_doc.write_doc(Path(args.doc), payload)
    return 0 if all("error" not in r for r in payload["results"]) else 1
