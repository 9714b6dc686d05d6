"""The fidelity report: real against simulated figures (:mod:`ridge_bench.fidelity.cases`), as
rows with ratios and verdicts, as markdown, and as the generated section of a doc.

Every figure is the median over repeats (a ratio per repeat first where it is a ratio of two
requests of the same repeat); ``ratio`` is simulated ÷ real. Verdicts: the **lever effects**
(:func:`lever_rows`: prefix-cache TTFT ratio, concurrency scaling, n-gram speed-up, n-gram
tokens per decode step) pass within ``tolerance``, the ratios of times within ``timed_factor``
when given; every request's **prompt tokens** must be equal on both sides
(:func:`token_mismatches`); absolute figures are reported without a verdict.

The markdown and the doc's generated section: :mod:`ridge_bench.fidelity.doc`.
See docs/benchmarks/fidelity.md#verdicts-as-computed.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TOLERANCE = 0.25
STEPS = "n-gram tokens per decode step, "
"""The figures (names start so) that are counts, not times."""
Results = Mapping[str, Any]


@dataclass(frozen=True)
class Row:
    """One figure, both sides; ``ratio`` = simulated ÷ real; ``verdict`` pass, FAIL or empty."""

    figure: str
    real: float
    sim: float
    unit: str = ""
    verdict: str = ""

    @property
    def ratio(self) -> float:
        return self.sim / self.real if self.real else float("nan")


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def per_repeat(case: Mapping[str, Any], top: str, bottom: str) -> float:
    """The median over repeats of ``case[top][i] / case[bottom][i]``."""
    return median([a / b for a, b in zip(case[top], case[bottom], strict=True) if b])


def concurrency_levels(results: Results) -> list[int]:
    return sorted(int(k.split("_")[1]) for k in results if k.startswith("concurrent_"))


def lever_figures(results: Results) -> dict[str, float]:
    """The lever effects of one side (module docstring), keyed by figure name."""
    single = median(results["decode"]["tokens_per_s"])
    out = {"prefix cache: cached ÷ cold TTFT": per_repeat(results["prefix"], "cached_ttft_s",
                                                          "cold_ttft_s")}
    for n in concurrency_levels(results):
        total = median(results[f"concurrent_{n}"]["total_tokens_per_s"])
        out[f"concurrency: {n} streams ÷ 1, total decode rate"] = total / single
    for case in ("copy", "chat"):
        out[f"n-gram speed-up, {case}: spec ÷ plain decode rate"] = per_repeat(
            results[case], "spec_tokens_per_s", "plain_tokens_per_s")
    for case in ("copy", "chat"):
        if "spec_completion_tokens" in results[case]:
            out[f"{STEPS}{case}"] = tokens_per_step(results[case])
    return out


def tokens_per_step(case: Mapping[str, Any]) -> float:
    """Median over the spec runs of (c − 1) ÷ (c − 1 − a) [tokens per decode step]."""
    steps = []
    for c, accepted in zip(case["spec_completion_tokens"], case["accepted_per_position"],
                           strict=True):
        decode = c - 1
        if decode > sum(accepted):
            steps.append(decode / (decode - sum(accepted)))
    return median(steps)


def _within(ratio: float, tolerance: float, factor: float | None) -> bool:
    if factor is None:
        return abs(ratio - 1.0) <= tolerance
    return 1.0 / factor <= ratio <= factor


def lever_rows(real: Results, sim: Results, tolerance: float = TOLERANCE,
               timed_factor: float | None = None) -> list[Row]:
    """The lever effects, real and simulated, each with its verdict (module docstring)."""
    ours = lever_figures(sim)
    rows = []
    for name, value in lever_figures(real).items():
        factor = None if name.startswith(STEPS) else timed_factor
        ok = value > 0 and _within(ours.get(name, float("nan")) / value, tolerance, factor)
        rows.append(Row(name, value, ours.get(name, float("nan")), "×",
                        "pass" if ok else "FAIL"))
    return rows


def absolute_rows(real: Results, sim: Results) -> list[Row]:
    """Times [s] and rates [tokens/s] (no verdict)."""
    def fig(r: Results, case: str, key: str) -> float:
        return median(r[case][key])

    specs = [("short prompt TTFT", "short", "ttft_s", "s"),
             ("~1,000-token prompt, cold TTFT", "long", "ttft_s", "s"),
             ("shared ~800-token prefix, cold TTFT", "prefix", "cold_ttft_s", "s"),
             ("shared ~800-token prefix, cached TTFT", "prefix", "cached_ttft_s", "s"),
             ("one stream, decode rate", "decode", "tokens_per_s", "tok/s")]
    rows = [Row(name, fig(real, c, k), fig(sim, c, k), unit) for name, c, k, unit in specs]
    for n in concurrency_levels(real):
        case = f"concurrent_{n}"
        rows.append(Row(f"{n} new requests together, total decode rate", fig(real, case,
                        "total_tokens_per_s"), fig(sim, case, "total_tokens_per_s"), "tok/s"))
    for case in ("copy", "chat"):
        for pool in ("plain", "spec"):
            key = f"{pool}_tokens_per_s"
            rows.append(Row(f"{case} task on {pool}, decode rate", fig(real, case, key),
                            fig(sim, case, key), "tok/s"))
    return rows


def ttft_ranks(results: Results, n: int) -> list[float]:
    """Median over repeats of the k-th first token among ``n`` concurrent requests, k = 1..n."""
    runs = results[f"concurrent_{n}"]["ttft_s"]
    return [median([run[k] for run in runs]) for k in range(n)]


def acceptance(results: Results, case: str) -> list[float]:
    """Accepted drafts at each position ÷ drafts, over every spec run of ``case``."""
    data = results[case]
    drafts = sum(data["drafts"])
    per_pos = [sum(run[i] for run in data["accepted_per_position"])
               for i in range(len(data["accepted_per_position"][0]))]
    return [a / drafts if drafts else 0.0 for a in per_pos]


def token_cases(results: Results) -> list[str]:
    return [k for k, v in results.items() if isinstance(v, Mapping) and "prompt_tokens" in v]


def token_mismatches(real: Results, sim: Results) -> list[str]:
    """Every case whose requests' prompt token counts differ, with both lists."""
    out = []
    for case in token_cases(real):
        a, b = real[case]["prompt_tokens"], sim.get(case, {}).get("prompt_tokens")
        if a != b:
            out.append(f"{case}: real {a}, simulated {b}")
    return out
