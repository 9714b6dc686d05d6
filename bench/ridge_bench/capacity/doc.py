"""The generated block of ``docs/benchmarks/capacity.md``, from a capacity run's results.json
(:mod:`ridge_bench.capacity.benchmark`): the trace and its bounds, then one table row per cell."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ridge_bench.harness.doc_block import write_block

BEGIN, END = "<!-- capacity:begin -->", "<!-- capacity:end -->"
HEADER = ("| fleet | router | fleet KV (device + host), M tokens | LRU bound | engine hit rate "
          "| ÷ unlimited bound | goodput req/s (met SLOs) | TTFT p50 / p99 s "
          "| max/mean requests per replica | gateway peak RSS, MB | flags |")


def _f(value: Any, digits: int = 3) -> str:
    return "–" if value is None else f"{float(value):.{digits}f}"


def row(cell: Mapping[str, Any], bounds: Mapping[str, Any]) -> str:
    """One cell's table row."""
    cache = cell.get("engine_prefix_cache") or {}
    summary = cell["summary"]
    hit = cache.get("hit_rate")
    unlimited = float(bounds["unlimited"])
    ratio = None if hit is None or unlimited <= 0 else hit / unlimited
    kv = bounds["fleet_kv_tokens"].get(cell["fleet"])
    attained = summary.get("attainment")
    flags = ", ".join(f"{n} saturated" for n in cell.get("saturated", [])) or ""
    if cell.get("interrupted"):
        flags = (flags + ", " if flags else "") + "interrupted"
    return " | ".join([
        f"| {cell['fleet']}", cell["router"], _f(None if kv is None else kv / 1e6, 2),
        _f(bounds["lru"].get(cell["fleet"])), _f(hit), _f(ratio, 2),
        f"{_f(summary['goodput_rps'], 2)} ({_f(attained, 3)})",
        f"{_f(summary['ttft_p50_s'], 2)} / {_f(summary['ttft_p99_s'], 2)}",
        _f(cache.get("max_mean_requests_per_replica"), 2),
        _f(cell.get("gateway_peak_rss_mb"), 0), flags]) + " |"


def markdown(results: Mapping[str, Any]) -> str:
    """The block: what ran, the bounds, the table."""
    meta, bounds = results["meta"], results["meta"]["bounds"]
    slo = meta.get("slo", {})
    lines = [
        f"Trace `{meta['trace']}`: {bounds['requests']} requests over {bounds['span_s']:.0f} s "
        f"({bounds['requests'] / max(bounds['span_s'], 1e-9):.2f} req/s), "
        f"{bounds['prompt_tokens_mean']:,.0f} prompt tokens on average. "
        f"Unlimited shared cache bound: **{bounds['unlimited']:.3f}**. Seed {meta['seed']}, "
        f"simulator at {meta['speed']:g}× real time, figures in simulated seconds; SLOs TTFT ≤ "
        f"{slo.get('ttft_s', '?')} s, TPOT ≤ {slo.get('tpot_s', '?')} s, e2e ≤ "
        f"{slo.get('e2e_s', '?')} s.",
        "",
        HEADER,
        "|" + "---|" * HEADER.count(" | ") + "---|",
        *(row(c, bounds) for c in results["cells"]),
        "",
        f"Command: `{meta.get('command', '')}`",
    ]
    return "\n".join(lines)


def write(doc: Path, results: Mapping[str, Any]) -> None:
    """Rewrite ``doc``'s generated block."""
    write_block(doc, BEGIN, END, markdown(results))
