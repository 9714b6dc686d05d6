"""``ridge bench calibrate``: measure the real vLLM CPU engine again and refit the simulator's
``cpu-smollm2`` profile, in one command.

``ridge bench calibrate [--repeats 5] [--url URL] [--fit-only] [--dry-run]``:

1. **Measure** (unless ``--fit-only``): ``tests/real_engine/measure_ground_truth.py`` rewrites
   ``backends/sim/profiles/ground_truth_cpu.json`` from one real engine (or ``--url``).
2. **Fit** the profile's free constants (:mod:`backends.sim.profiles.fit`), holding its
   bandwidth and attention efficiency.
3. **Write** them to ``backends/sim/profiles/cpu_smollm2.json`` and the rates into the real-demo
   fleet file (``gateway/demo/demo-real-fleet.yaml``).
4. **The answer style** of the n-gram pool's model, measured and fitted the same way
   (:func:`backends.sim.style_fit.fitted`).

``--dry-run`` writes nothing. Exit status: 0 done, 1 the measurement failed, 2 figures the model
cannot fit. See docs/benchmarks/fidelity.md#calibration.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from backends.sim.profiles import HARDWARE, MODELS
from backends.sim.profiles.calibration import Calibration, calibration_path, write_calibration
from backends.sim.profiles.fit import Fit, Machine, figures_from_truth, fit, rounded
from backends.sim.style_fit import fitted as fitted_style
from ridge_bench.harness.procs import ROOT

PROFILE = "cpu-smollm2"
CONSTANTS_FILE = "cpu_smollm2.json"
TRUTH = calibration_path("ground_truth_cpu.json")
FLEET_FILE = ROOT / "gateway" / "demo" / "demo-real-fleet.yaml"
MEASURE_MODULE = "tests.real_engine.measure_ground_truth"
STYLE_MODULE = "tests.real_engine.measure_ngram_style"
STYLE_TRUTH = calibration_path("ground_truth_ngram.json")
_STYLE = re.compile(r"\{copy_slip:[^}]*\}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ridge bench calibrate", description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5, help="runs per figure (median; default 5)")
    p.add_argument("--url", help="measure this running engine instead of starting one")
    p.add_argument("--fit-only", action="store_true",
                   help="no measurement: refit from the figures already in the file")
    p.add_argument("--dry-run", action="store_true", help="print the fit, write nothing")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="seconds the measurement may take (default 1800)")
    return p


def measure(truth: Path, repeats: int, url: str | None, timeout_s: float) -> None:
    """Run the ground-truth measurement into ``truth`` (CalledProcessError, TimeoutExpired)."""
    argv = [sys.executable, "-m", MEASURE_MODULE, "--repeats", str(repeats), "--out", str(truth)]
    subprocess.run([*argv, *(["--url", url] if url else [])], cwd=ROOT, check=True,
                   timeout=timeout_s)


def measure_style(truth: Path, timeout_s: float) -> None:
    """Run the answer-style measurement into ``truth`` (CalledProcessError, TimeoutExpired)."""
    subprocess.run([sys.executable, "-m", STYLE_MODULE, "--out", str(truth)], cwd=ROOT,
                   check=True, timeout=timeout_s)


def sync_style(text: str, knobs: dict[str, float]) -> str:
    """``text`` (a fleet file) with its ``{copy_slip: ...}`` mapping holding ``knobs``."""
    mapping = "{" + ", ".join(f"{k}: {v:g}" for k, v in knobs.items()) + "}"
    return _STYLE.sub(mapping, text, count=1)


def style(args: argparse.Namespace, tmp: Path) -> int:
    """Step 4 (module docstring): measure unless ``--fit-only``, fit, write unless
    ``--dry-run``."""
    path = STYLE_TRUTH
    if args.dry_run:
        path = tmp / STYLE_TRUTH.name
        shutil.copy(STYLE_TRUTH, path)
    if not args.fit_only and args.url is None:
        try:
            measure_style(path, args.timeout)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            print(f"ridge bench calibrate: the answer-style measurement failed: {exc}",
                  file=sys.stderr)
            return 1
    knobs = fitted_style(json.loads(path.read_text()))
    print("answer style:", json.dumps(knobs))
    if not args.dry_run and FLEET_FILE.exists():
        FLEET_FILE.write_text(sync_style(FLEET_FILE.read_text(), knobs))
    return 0


def fit_truth(truth: dict[str, Any]) -> Fit:
    """The fit of ``truth``'s figures, with the profile's fixed bandwidth and efficiency."""
    profile = HARDWARE[PROFILE]
    shape = MODELS[truth["model"]].to_shape(profile.kv_dtype_bytes)
    machine = Machine(shape, profile.facts.mem_bandwidth, profile.attention_efficiency)
    decode, prefills = figures_from_truth(truth)
    return fit(machine, decode, prefills, start_peak=profile.facts.peak_flops)


def table(old: Calibration, new: Calibration, error: float) -> str:
    """Old and new constants, one per line, and the fit's largest TTFT error."""
    lines = [f"{'constant':<22}{'before':>12}{'fitted':>12}"]
    for (name, before), after in zip(asdict(old).items(), asdict(new).values(), strict=True):
        lines.append(f"{name:<22}{before:>12.4g}{after:>12.4g}")
    lines.append(f"largest relative TTFT error of the fit: {error:.1%}")
    return "\n".join(lines)


_VALUE = re.compile(r"^(?P<head>\s*(?P<key>peak_flops|mem_bandwidth):\s*)(?P<value>[^\s#]+)")


def sync_rates(text: str, profile: str, peak_flops: float, mem_bandwidth: float) -> str:
    """``text`` (a fleet file) with the ``peak_flops`` and ``mem_bandwidth`` values rewritten
    in every block mapping whose ``name: PROFILE`` line precedes them (same indentation, until
    a line indented less); comments and their alignment kept."""
    values = {"peak_flops": f"{peak_flops:.3g}", "mem_bandwidth": f"{mem_bandwidth:.3g}"}
    named = re.compile(rf"name:\s*{re.escape(profile)}\s*(#|$)")
    lines = text.splitlines(keepends=True)
    depth: int | None = None
    for i, line in enumerate(lines):
        body = line.lstrip(" ")
        indent = len(line) - len(body)
        if named.match(body):
            depth = indent
        elif depth is not None and body.strip() and indent < depth:
            depth = None
        elif depth == indent and (match := _VALUE.match(line)):
            value = values[match["key"]].ljust(len(match["value"]))
            lines[i] = match["head"] + value + line[match.end():]
    return "".join(lines)


def write(fitted: Calibration, truth: dict[str, Any]) -> None:
    """The constants file, and the fleet file's rates."""
    notes = {"profile": PROFILE, "fitted_to": TRUTH.name,
             "fitted_on": time.strftime("%Y-%m-%d"),
             "figures_measured_on": truth.get("measured_on", "unknown"),
             "method": "backends.sim.profiles.fit (ridge bench calibrate); mem_bandwidth "
                       "measured from vLLM's oneDNN GEMV, not fitted"}
    write_calibration(calibration_path(CONSTANTS_FILE), fitted, notes)
    if FLEET_FILE.exists():
        old = FLEET_FILE.read_text()
        new = sync_rates(old, PROFILE, fitted.peak_flops, fitted.mem_bandwidth)
        if new != old:
            FLEET_FILE.write_text(new)


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="calibrate-") as tmp:
        truth_path = TRUTH
        if args.dry_run:
            truth_path = Path(tmp) / TRUTH.name
            shutil.copy(TRUTH, truth_path)
        if not args.fit_only:
            try:
                measure(truth_path, args.repeats, args.url, args.timeout)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
                print(f"ridge bench calibrate: the measurement failed: {exc}", file=sys.stderr)
                return 1
        truth = json.loads(truth_path.read_text())
    try:
        result = fit_truth(truth)
    except ValueError as exc:
        print(f"ridge bench calibrate: {exc}", file=sys.stderr)
        return 2
    fitted = rounded(result.calibration)
    print(table(_current(), fitted, result.max_relative_error))
    if not args.dry_run:
        write(fitted, truth)
        print(f"wrote {calibration_path(CONSTANTS_FILE)} and the rates in {FLEET_FILE}")
    with tempfile.TemporaryDirectory(prefix="calibrate-") as tmp:
        return style(args, Path(tmp))


def _current() -> Calibration:
    profile = HARDWARE[PROFILE]
    over = profile.overheads
    return Calibration(profile.facts.peak_flops, profile.facts.mem_bandwidth,
                       profile.attention_efficiency, over.request_s, over.step_s, over.seq_s)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.repeats < 1:
        parser().error("--repeats must be at least 1")
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
