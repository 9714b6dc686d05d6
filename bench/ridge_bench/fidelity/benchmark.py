"""``ridge bench fidelity``: the simulator against the real vLLM CPU engine, side by side.

``ridge bench fidelity [--fleet FILE] [--repeats 3] [--doc FILE] [--json FILE] [--no-doc]
[--max-seconds 3600]``. The fleet needs a "plain" pool and an n-gram "spec" pool serving one
model (the real-demo fleet has them). Each step bounded: the simulated side
(:func:`backends.sim.start_fleet`, speed 1, in this process) and then the real side
(:func:`backends.launch.real_fleet.start_real_fleet`) answer the requests of
:mod:`ridge_bench.fidelity.cases`; the report (:mod:`ridge_bench.fidelity.doc`) is printed and
written into the doc's generated section, the raw figures to the JSON file.

Exit status: 0 when every lever effect is within the tolerance and every prompt's token count
is equal, 1 when not, 2 when a side could not be started or measured. vLLM only (SGLang needs
CUDA). See docs/benchmarks/fidelity.md#the-fidelity-run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp

from backends.launch.real_fleet import RealFleetError, start_real_fleet
from backends.sim import start_fleet
from config.fleet import Fleet, FleetConfigError, load_fleet
from config.pools import Pool
from gateway.cli.demo_ports import endpoint_urls, free_engine_ports
from ridge_bench.fidelity.cases import FidelitySetup, Results, Side, measure
from ridge_bench.fidelity.client import FidelityError
from ridge_bench.fidelity.doc import markdown, write_doc
from ridge_bench.fidelity.report import TOLERANCE, lever_rows, token_mismatches
from ridge_bench.harness.procs import ROOT
from ridge_bench.overhead.doc import machine, now, ridge_version

FLEET = ROOT / "gateway" / "demo" / "demo-real-fleet.yaml"
DOC = ROOT / "docs" / "benchmarks" / "fidelity.md"
RAW = ROOT / "docs" / "benchmarks" / "fidelity.json"
ENGINE_START_S = 300.0


def spec_and_plain(fleet: Fleet) -> tuple[Pool, Pool]:
    """The fleet's n-gram pool and its pool without speculation; FleetConfigError if none."""
    spec = [p for p in fleet.pools if p.levers.speculative is not None
            and p.levers.speculative.method == "ngram"]
    plain = [p for p in fleet.pools if p.levers.speculative is None]
    if not spec or not plain or plain[0].models[0] not in spec[0].models:
        raise FleetConfigError("the fidelity report needs an n-gram speculative pool and a pool "
                               "without speculation that serve the same model")
    return spec[0], plain[0]


def on_free_ports(fleet: Fleet) -> Fleet:
    """``fleet`` with every endpoint moved to a free port of this machine."""
    return free_engine_ports(fleet, endpoint_urls(fleet))


def side_of(name: str, fleet: Fleet) -> Side:
    spec, plain = spec_and_plain(fleet)
    return Side(name, plain.endpoint_urls()[0], spec.endpoint_urls()[0], plain.models[0])


def setup_for(fleet: Fleet, repeats: int, **knobs: Any) -> FidelitySetup:
    """A setup whose draft positions are the spec pool's K."""
    spec = spec_and_plain(fleet)[0].levers.speculative
    assert spec is not None
    return FidelitySetup(repeats=repeats, spec_k=spec.num_draft_tokens, **knobs)


async def simulated(fleet: Fleet, setup: FidelitySetup) -> Results:
    """The requests against the fleet simulated in this process (speed 1, seed 0)."""
    moved = on_free_ports(fleet)
    running = await start_fleet(moved, speed=1.0, seed=0)
    try:
        return await measure(setup, side_of("simulated", moved))
    finally:
        await running.stop()


async def real(fleet: Fleet, setup: FidelitySetup, log_dir: Path) -> Results:
    """The requests against real vLLM engines started for the fleet's pools."""
    moved = on_free_ports(fleet)
    running = await start_real_fleet(moved, log_dir, startup_timeout_s=ENGINE_START_S)
    try:
        return await measure(setup, side_of("real", moved))
    finally:
        await running.stop()


def verdict(real_side: Results, sim_side: Results, tolerance: float = TOLERANCE,
            timed_factor: float | None = None) -> list[str]:
    """What fails: lever effects off by more than ``tolerance`` (ratios of times, with
    ``timed_factor``, by more than that factor), unequal prompt tokens."""
    levers = [f"{r.figure}: real {r.real:.3f}, simulated {r.sim:.3f}"
              for r in lever_rows(real_side, sim_side, tolerance, timed_factor)
              if r.verdict != "pass"]
    return levers + token_mismatches(real_side, sim_side)


def meta(fleet_path: Path, setup: FidelitySetup, started: str, seconds: float) -> dict[str, Any]:
    """The run's facts (no paths of this machine)."""
    try:
        fleet = str(fleet_path.resolve().relative_to(ROOT))
    except ValueError:
        fleet = fleet_path.name
    return {"date": started, "ridge": ridge_version(ROOT), "machine": machine(),
            "fleet": fleet, "repeats": setup.repeats,
            "tokens": f"decode {setup.decode_tokens}, copy {setup.copy_tokens}, "
                      f"chat {setup.chat_tokens}", "run": f"{seconds:.0f} s"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ridge bench fidelity", description=__doc__.splitlines()[0])
    p.add_argument("--fleet", type=Path, default=FLEET, help="fleet file (default: real demo)")
    p.add_argument("--repeats", type=int, default=3, help="runs per figure (median; default 3)")
    p.add_argument("--doc", type=Path, default=DOC, help="doc whose generated section to write")
    p.add_argument("--json", type=Path, default=RAW, help="raw figures of both sides")
    p.add_argument("--no-doc", action="store_true", help="print only: no doc, no JSON")
    p.add_argument("--max-seconds", type=float, default=3600.0,
                   help="bound on the whole run (default 3600)")
    return p


async def both(fleet: Fleet, setup: FidelitySetup) -> tuple[Results, Results]:
    """Simulated side, then real side (engine logs in a temporary folder, kept on failure)."""
    sim_side = await simulated(fleet, setup)
    logs = Path(tempfile.mkdtemp(prefix="fidelity-engines-"))
    print(f"simulated side measured; starting the real engines (logs in {logs})", flush=True)
    return await real(fleet, setup, logs), sim_side


def _bounded(run: Callable[[], Coroutine[Any, Any, tuple[Results, Results]]],
             seconds: float) -> tuple[Results, Results]:
    return asyncio.run(asyncio.wait_for(run(), seconds))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    started, clock = now(), time.monotonic()
    try:
        fleet = load_fleet(str(args.fleet))
        setup = setup_for(fleet, args.repeats)
        real_side, sim_side = _bounded(lambda: both(fleet, setup), args.max_seconds)
    except (FleetConfigError, RealFleetError, FidelityError, aiohttp.ClientError, OSError,
            TimeoutError, ValueError) as exc:  # ValueError: the simulator refuses a pool
        print(f"ridge bench fidelity: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    facts = meta(args.fleet, setup, started, time.monotonic() - clock)
    text = markdown(real_side, sim_side, facts)
    print(text)
    if not args.no_doc:
        write_doc(args.doc, text)
        raw = {"meta": facts, "plan": asdict(setup), "real": real_side, "simulated": sim_side}
        args.json.write_text(json.dumps(raw, indent=1) + "\n")
    failures = verdict(real_side, sim_side)
    for line in failures:
        print(f"FAIL {line}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
