"""What ``ridge plan`` prints and writes: the ranked table, a line of why per pool, the fleet file.

:func:`table` ranks the candidates replayed on the whole trace (units in
:mod:`gateway.plan.score`); :func:`explain` gives each pool of the best plan the wall the
gateway named for it, the share of requests it answered and what removing it costs (the best
fleet the search replayed without that pool's recipe); :func:`fleet_yaml` writes the best
candidate as a fleet file with a header saying where it came from and a ``plan:`` section of
what it predicts, which the gateway then compares with what it measures.
docs/planning.md#reading-a-plan.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from gateway.plan.search import Problem, Result
from gateway.plan.space import BY_NAME, Candidate, fleet_document

COLUMNS = ("#", "fleet", "goodput/s", "per GPU", "good %", "TTFT p50", "TTFT p99", "TPOT p50",
           "TPOT p99", "hit %", "MFU %", "MBU %", "$/Mtok", "pools: share, wall")


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.0f} ms"


def _cost(value: float) -> str:
    return "-" if math.isinf(value) else f"{value:.3f}"


def row(rank: int, r: Result) -> list[str]:
    s = r.score
    pools = "; ".join(f"{p.name} {p.share:.0%} {p.wall}" for p in s.pools)
    return [str(rank), r.candidate.label, f"{s.goodput:.3f}", f"{s.goodput_per_gpu:.3f}",
            f"{s.good_share:.0%}", _ms(s.ttft_p50), _ms(s.ttft_p99), _ms(s.tpot_p50),
            _ms(s.tpot_p99), f"{s.hit_rate:.0%}", f"{s.mfu:.1%}", f"{s.mbu:.1%}",
            _cost(s.cost_per_mtok), pools]


def table(results: Sequence[Result], limit: int = 10) -> str:
    """The best ``limit`` results as an aligned text table."""
    rows = [list(COLUMNS), *(row(i, r) for i, r in enumerate(results[:limit], 1))]
    widths = [max(len(r[c]) for r in rows) for c in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


def explain(best: Result, results: Sequence[Result], problem: Problem) -> list[str]:
    """One line per pool of ``best`` (module docstring)."""
    lines = []
    by_pool = {p.name: p for p in best.score.pools}
    for part in best.candidate.parts:
        recipe = BY_NAME[part.recipe]
        names = ([f"{recipe.name}-prefill", f"{recipe.name}-decode"] if recipe.pair
                 else [recipe.name])
        pool = by_pool[names[0]]
        without = next((r for r in results
                        if part.recipe not in {p.recipe for p in r.candidate.parts}), None)
        cost = ("no fleet without it was replayed" if without is None else
                f"without it the best fleet replayed ({without.candidate.label}) has "
                f"{_change(without.score.goodput, best.score.goodput)} goodput")
        lines.append(f"{' + '.join(names)} ({part.gpus} GPU{'s' if part.gpus > 1 else ''}): "
                     f"{recipe.why}; takes {pool.share:.0%} of the requests; binding wall "
                     f"{pool.wall}; {cost}")
    return lines


def headroom(fewest: Mapping[Candidate, int], problem: Problem) -> list[str]:
    """What the search's tie-break found (:attr:`gateway.plan.search.Search.fewest`): the
    fewest GPUs each tied leader held the SLO on, the plan's first."""
    if not fewest:
        return []
    ranked = sorted(fewest, key=lambda c: fewest[c])
    lines = [f"{len(ranked)} fleets tie, holding the SLO ({problem.attainment:.0%} of requests "
             "good); replayed on fewer GPUs in the same proportions:"]
    for c in ranked:
        n = fewest[c]
        lines.append(f"  {c.label}: holds it on {n} GPU{'s' if n > 1 else ''}"
                     if n < problem.gpus
                     else f"  {c.label}: not on {problem.gpus - 1}")
    return lines


def _change(new: float, old: float) -> str:
    if old <= 0:
        return f"{new:.3f}/s against {old:.3f}/s"
    return f"{(new - old) / old:+.0%}"


def fleet_yaml(best: Result, problem: Problem, source: str, evaluations: int) -> str:
    """The fleet file of ``best``, with a header of where it came from and what it predicts."""
    t, s = problem.brief, best.score
    slo = ", ".join(f"{k} {v:g} s" for k, v in (("TTFT", t.ttft_s), ("TPOT", t.tpot_s))
                    if v is not None) or "none"
    header = [
        f"Planned by `ridge plan` from {source} ({len(problem.entries)} requests, "
        f"arrivals x{problem.scale:g}, seed {problem.seed}).",
        f"{problem.gpus} x {t.accelerator}, model {t.model}, engine {t.engine}, SLO {slo}, "
        f"objective {problem.objective}; {evaluations} replays searched.",
        f"Predicted on the simulator: goodput {s.goodput:.3f} req/s "
        f"({s.goodput_per_gpu:.3f} per GPU, {s.good_share:.0%} of requests good), TTFT p50 "
        f"{_ms(s.ttft_p50)} / p99 {_ms(s.ttft_p99)}, TPOT p50 {_ms(s.tpot_p50)} / p99 "
        f"{_ms(s.tpot_p99)}, prefix-cache hits {s.hit_rate:.0%}.",
        "Endpoints are placeholders: point them at your engines, or deploy with "
        "`ridge render compose|k8s` (docs/planning.md).",
    ]
    doc = fleet_document(best.candidate, t)
    doc["plan"] = plan_section(best, doc, source)
    body = yaml.safe_dump(doc, sort_keys=False, width=100)
    return "".join(f"# {line}\n" for line in header) + body


def plan_section(best: Result, doc: dict[str, Any], source: str) -> dict[str, Any]:
    """The fleet file's ``plan:`` (:mod:`config.plan_section`): per pool chosen by the router
    (decode pools left out), its share of the answered requests and its wall."""
    decode = {p["name"] for p in doc["pools"] if p.get("role") == "decode"}
    chosen = [p for p in best.score.pools if p.name not in decode]
    total = sum(p.share for p in chosen)
    return {"source": source, "pools": {
        p.name: {"share": round(p.share / total, 4) if total else 0.0, "wall": p.wall}
        for p in chosen}}
