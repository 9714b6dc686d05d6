"""``ridge plan --trace FILE --gpus N --accelerator NAME --model NAME [...]``: plan a fleet.

Reads a Mooncake-format trace (one ridge recorded with ``RIDGE_TRACE__PATH``, or any other),
searches fleets of pools with different levers on N GPUs (:mod:`gateway.plan.search`),
replaying the trace through ridge's own gateway in front of the simulator on virtual time for
each one, prints the ranked table and a line of why per pool of the best, and writes the best
as a fleet file (``--out``). Progress goes to stderr, one line per replay. The gateway's
settings are the environment's (``RIDGE_*``: admission, routing state bounds, timeouts), with
authentication, trace recording and Redis off. A bad flag, trace or name ends it with status 2
and one line. docs/planning.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from config.builtin_facts import UnknownName, find_accelerator, find_model
from gateway.cli.flags import count, positive
from gateway.plan.compare import (
    PLAN,
    UNIFORM,
    Point,
    gpus_table,
    side_by_side,
    sweep,
    sweep_table,
)
from gateway.plan.executors import RayExecutor, local_executor
from gateway.plan.plots import PlotsUnavailable, cost_against_ttft, goodput_against_gpus
from gateway.plan.report import explain, fleet_yaml, headroom, table
from gateway.plan.score import OBJECTIVES
from gateway.plan.search import Problem, Result, Search
from gateway.plan.sensitivity import sensitivity, verdicts
from gateway.plan.space import BY_NAME, RECIPES, Brief, available, why_not
from gateway.plan.trace import load_trace

PLAN_SETTINGS = {"auth": "off", "keys_file": None, "redis_url": None, "workers": 1,
                 "admin_port": None, "trace": {"path": None}, "log_level": "warning"}
"""What a replay's gateway never does, whatever the environment says."""

DESCRIPTION = (
    "Plan a fleet from recorded traffic: replay the trace through ridge in front of simulated "
    "candidate fleets on N GPUs (pools with different levers: prefix caching, chunk budgets, "
    "speculative decoding, fp8 KV, a host KV tier, prefill/decode pairs), rank them by the "
    "objective under the SLO, and write the best as a fleet file for `ridge serve` and "
    "`ridge render`.")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("plan", help="plan the fleet that serves a recorded trace best",
                       description=DESCRIPTION)
    p.add_argument("--trace", required=True, metavar="FILE",
                   help="Mooncake-format JSONL trace (what RIDGE_TRACE__PATH records)")
    p.add_argument("--gpus", required=True, type=count, metavar="N",
                   help="GPUs of the fleet (one engine per GPU)")
    p.add_argument("--accelerator", required=True, metavar="NAME",
                   help="accelerator from the built-in catalogue, e.g. nvidia-h100-sxm")
    p.add_argument("--model", required=True, metavar="NAME",
                   help="model from the built-in catalogue, e.g. llama-3.1-8b")
    p.add_argument("--engine", choices=("vllm", "sglang"), default="vllm",
                   help="the engine every pool runs (default vllm)")
    p.add_argument("--max-context", type=count, metavar="TOKENS",
                   help="the engines' context length (default: the model's)")
    p.add_argument("--draft-model", metavar="REPO",
                   help="the EAGLE draft model of the model: adds EAGLE speculation to the "
                        "search (without it, n-gram speculation only)")
    p.add_argument("--draft-acceptance", type=_fraction, default=0.7, metavar="ALPHA",
                   help="the chance the draft model's each draft is accepted once those "
                        "before it were (default 0.7; measure it: vllm:spec_decode_*)")
    p.add_argument("--slo", default="ttft=2,tpot=0.1", metavar="ttft=S,tpot=S",
                   help="the bounds a good request meets, in seconds (default ttft=2,tpot=0.1)")
    p.add_argument("--objective", choices=OBJECTIVES, default="goodput",
                   help="what to maximise (goodput, goodput_per_dollar) or minimise "
                        "(cost_per_mtok, ttft_p99); default goodput")
    p.add_argument("--price-per-gpu-hour", type=positive, default=2.0, metavar="USD",
                   help="for cost per million tokens (default 2.0)")
    p.add_argument("--scale", type=positive, default=1.0, metavar="K",
                   help="what-if load: arrivals K times as dense (default 1)")
    p.add_argument("--seed", type=int, default=0, help="the simulator's seed (default 0)")
    p.add_argument("--max-requests", type=count, metavar="N",
                   help="plan on the trace's first N requests only")
    p.add_argument("--recipes", metavar="A,B,...",
                   help=f"the pool recipes to search (default all that can run: "
                        f"{','.join(r.name for r in RECIPES)})")
    p.add_argument("--jobs", type=count, default=os.cpu_count() or 1, metavar="J",
                   help="replays at once, in local processes (default: one per core)")
    p.add_argument("--ray", metavar="ADDRESS",
                   help="run the replays on a Ray cluster instead (ray://HOST:10001, auto, or "
                        "local for one on this machine); every node needs ridge installed")
    p.add_argument("--rounds", type=int, default=3, metavar="R",
                   help="rounds of one-step moves from the best fleet (default 3)")
    p.add_argument("--out", default="planned-fleet.yaml", metavar="FLEET.yaml",
                   help="where the best fleet file goes (default planned-fleet.yaml); the "
                        "plots go beside it")
    p.add_argument("--compare", metavar="G,G,...",
                   help="also replay the plan, the best uniform fleet, one general pool and "
                        "that pool round robin on these GPU counts (the plan's own included)")
    p.add_argument("--compare-scales", default="1,2,4", metavar="K,K,...",
                   help="--compare: at these load scales (default 1,2,4)")
    p.add_argument("--attainment", type=_fraction, default=0.99, metavar="SHARE",
                   help="a fleet holds the SLO when this share of its requests is good "
                        "(default 0.99): ties among those go to the one that holds on the "
                        "fewest GPUs, and --compare counts GPUs by it")
    p.add_argument("--sensitivity", action="store_true",
                   help="replay the best 4 candidates again on engines 2x slower to decode, "
                        "then to prefill, and say whether the plan stays the best")
    p.add_argument("--no-plots", action="store_true", help="write no PNG plots")


def run(args: argparse.Namespace) -> int:
    try:
        problem = problem_of(args)
    except ValueError as exc:
        print(f"ridge plan: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        executor = RayExecutor(args.ray) if args.ray else local_executor(args.jobs)
    except ValueError as exc:
        print(f"ridge plan: {exc}", file=sys.stderr)
        return 2
    with executor:
        search = Search(problem, executor, _progress(started), rounds=args.rounds)
        results = search.run()
        best = results[0]
        print(table(results))
        print()
        print(f"best: {best.candidate.label}")
        for line in explain(best, results, problem):
            print(f"  {line}")
        for line in headroom(search.fewest, problem):
            print(f"  {line}")
        out = Path(args.out)
        out.write_text(fleet_yaml(best, problem, Path(args.trace).name, search.evaluations),
                       encoding="utf-8")
        points = _compare(args, problem, executor, results)
        shifted = _sensitivity(problem, executor, results) if args.sensitivity else []
    if not args.no_plots:
        _plots(out, results, points)
    more = [*(p.result for p in points), *shifted]
    cpu = sum(r.cpu_s for r in (*search.results.values(), *search.headroom.values(), *more))
    print(f"\nwrote {args.out}: {search.evaluations + len(more)} replays, {cpu:.0f} s of "
          f"CPU, {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


def _compare(args: argparse.Namespace, problem: Problem, executor: Executor,
             results: list[Result]) -> list[Point]:
    """``--compare``: the contenders swept and their tables printed (none without it)."""
    if not args.compare:
        return []
    uniform = next(r for r in results if len(r.candidate.parts) == 1)
    points = sweep(problem, executor, results[0].candidate, uniform.candidate,
                   sorted({*args.compare, problem.gpus}), args.compare_scales)
    here = side_by_side(points, problem.gpus)
    print(f"\non {problem.gpus} GPUs at the trace's rate:")
    for name, r in here.items():
        print(f"  {name:32} {r.candidate.label:40} goodput/GPU "
              f"{r.score.goodput_per_gpu:.3f}, {r.score.good_share:.0%} good")
    if UNIFORM in here and PLAN in here and here[UNIFORM].score.goodput > 0:
        lead = here[PLAN].score.goodput / here[UNIFORM].score.goodput - 1
        print(f"  the plan's lead over the best uniform fleet: {lead:+.1%} goodput")
    print()
    print(sweep_table(points))
    print()
    print(gpus_table(points, args.attainment))
    return points


def _sensitivity(problem: Problem, executor: Executor, results: list[Result]) -> list[Result]:
    """``--sensitivity``: the best 4 replayed on slower engines, a verdict per change."""
    print("\nhow the plan fares on engines slower than the simulator's:")
    shifts = sensitivity(problem, executor, results[:4])
    for line in verdicts(results[0], shifts):
        print(f"  {line}")
    return [r for s in shifts for r in s.ranked]


def _plots(out: Path, results: list[Result], points: list[Point]) -> None:
    stem = out.with_suffix("")
    try:
        written = [cost_against_ttft(results, Path(f"{stem}-cost-ttft.png"))]
        if points:
            written.append(goodput_against_gpus(points, Path(f"{stem}-goodput-gpus.png")))
    except PlotsUnavailable as exc:
        print(f"ridge plan: no plots: {exc}", file=sys.stderr)
        return
    print(f"plots: {', '.join(map(str, written))}", file=sys.stderr)


def problem_of(args: argparse.Namespace) -> Problem:
    """The planning problem the flags describe (``--compare``'s lists parsed into ``args``);
    ValueError naming what is wrong."""
    folder = Path(args.out).resolve().parent
    if not folder.is_dir():
        raise ValueError(f"--out {args.out}: no folder {folder}")
    args.compare = _numbers(args.compare, int, "--compare") if args.compare else []
    args.compare_scales = _numbers(args.compare_scales, float, "--compare-scales")
    try:
        find_model(args.model)
        find_accelerator(args.accelerator)
    except UnknownName as exc:
        raise ValueError(str(exc)) from None
    entries = load_trace(args.trace)[:args.max_requests]
    ttft, tpot = parse_slo(args.slo)
    brief = Brief(args.model, args.accelerator, args.engine, ttft, tpot, args.max_context,
                  args.draft_model, args.draft_acceptance)
    recipes = tuple(r.name for r in RECIPES if available(r, brief))
    if args.recipes:
        recipes = tuple(n.strip() for n in args.recipes.split(",") if n.strip())
        unknown = [n for n in recipes if n not in BY_NAME]
        if unknown or not recipes:
            raise ValueError(f"--recipes: unknown {', '.join(unknown) or 'none given'}; known: "
                             f"{', '.join(BY_NAME)}")
        if blocked := [n for n in recipes if not available(BY_NAME[n], brief)]:
            raise ValueError(f"--recipes: {', '.join(blocked)} need --draft-model")
    if args.gpus < 2:
        recipes = tuple(n for n in recipes if not BY_NAME[n].pair)
        if not recipes:
            raise ValueError("a prefill/decode pair needs at least 2 GPUs")
    recipes = _startable(recipes, brief, asked=bool(args.recipes))
    return Problem(tuple(entries), brief, args.gpus, args.scale, args.seed,
                   dict(PLAN_SETTINGS), args.price_per_gpu_hour, args.objective, recipes,
                   args.attainment)


def _startable(recipes: tuple[str, ...], brief: Brief, asked: bool) -> tuple[str, ...]:
    """The recipes whose engines would start; one that would not is an error when asked for,
    else left out with a line on stderr."""
    reasons = {name: why_not(BY_NAME[name], brief) for name in recipes}
    kept = tuple(name for name, why in reasons.items() if why is None)
    if not kept:
        raise ValueError(f"no recipe can run: {reasons[recipes[0]]}; try --max-context or a "
                         "larger accelerator")
    for name, why in reasons.items():
        if why is not None and asked:
            raise ValueError(f"{name}: {why}")
        if why is not None:
            print(f"ridge plan: leaving out {name}: {why}", file=sys.stderr)
    return kept


def parse_slo(text: str) -> tuple[float | None, float | None]:
    """``ttft=S,tpot=S`` (either may be left out) → (TTFT, TPOT) bounds [s]."""
    bounds: dict[str, float] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = item.partition("=")
        if key not in ("ttft", "tpot"):
            raise ValueError(f"--slo: {item!r}: give ttft=SECONDS and/or tpot=SECONDS")
        try:
            bounds[key] = positive(value)
        except argparse.ArgumentTypeError as exc:
            raise ValueError(f"--slo {key}: {exc}") from None
    return bounds.get("ttft"), bounds.get("tpot")


def _numbers(text: str, kind: type[int] | type[float], flag: str) -> list[Any]:
    """``A,B,...``, each a number of ``kind`` above 0."""
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{flag}: not a list of numbers: {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"{flag}: give numbers above 0, got {text!r}")
    return values


def _fraction(text: str) -> float:
    value = positive(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"must be below 1, got {text!r}")
    return value


def _progress(started: float) -> Callable[[str, int, int, Result], None]:
    def report(stage: str, done: int, total: int, r: Result) -> None:
        s = r.score
        print(f"[{time.monotonic() - started:6.0f} s] {stage} {done}/{total} "
              f"({r.share:.0%} of the trace) {r.candidate.label}: goodput {s.goodput:.3f}/s, "
              f"{s.good_share:.0%} good, {r.cpu_s:.1f} s CPU", file=sys.stderr, flush=True)
    return report
