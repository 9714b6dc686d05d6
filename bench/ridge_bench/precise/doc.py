"""The precise-routing page's generated block: one row per router, from the results file.

Per router: requests answered of those sent, errors by kind, each engine's prefix-cache hit
rate and both engines' (Σ hits / Σ queries of the engines' own token counters over the run),
the requests each engine finished, and client-side TTFT p50/p99 over the answered requests;
then what each router reports of its own routing (ridge's counters, ``kv_aware``'s decision
outcomes) and the run's facts. A router that could not run shows the first line of its error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ridge_bench.harness.doc_block import write_block

BEGIN, END = "<!-- precise:begin -->", "<!-- precise:end -->"
HEADER = ("router", "answered / sent", "errors", "hit rate, engine 1", "engine 2", "both",
          "requests per engine", "TTFT p50 [s]", "TTFT p99 [s]")


def num(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def endpoint_rate(use: Mapping[str, Any] | None) -> float | None:
    """hits / queries of one endpoint's counters (None without queries)."""
    if not use or not use.get("queries_tokens"):
        return None
    return float(use["hits_tokens"]) / float(use["queries_tokens"])


def errors_text(errors: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in sorted(errors.items())) or "0"


def row(result: Mapping[str, Any], endpoints: Sequence[str]) -> list[str]:
    """One router's cells (module doc)."""
    if "error" in result:
        first = str(result["error"]).splitlines()[0] if result["error"] else "error"
        return [result["label"], f"could not run: {first}", *["–"] * (len(HEADER) - 2)]
    summary, cache = result["summary"], result.get("engine_prefix_cache") or {}
    uses = [(cache.get("endpoints") or {}).get(url) for url in endpoints]
    counts = " / ".join("–" if not u or u.get("requests") is None else f"{u['requests']:.0f}"
                        for u in uses)
    return [result["label"], f"{summary['ok']} / {summary['requests']}",
            errors_text(summary["errors"]), *(num(endpoint_rate(u)) for u in uses),
            num(cache.get("hit_rate")), counts, num(summary["ttft_p50_s"], 2),
            num(summary["ttft_p99_s"], 2)]


def table(results: Sequence[Mapping[str, Any]], endpoints: Sequence[str]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER)]
    lines += ["| " + " | ".join(row(r, endpoints)) + " |" for r in results]
    return "\n".join(lines)


def own_figures(result: Mapping[str, Any]) -> str | None:
    """What the router reports of its routing, as one line (None: nothing)."""
    if "ridge" in result:
        f = result["ridge"]
        return (f"{result['label']}: {num(f.get('kv_events_applied'), 0)} KV events applied; "
                f"{num(f.get('prefix_predicted_tokens'), 0)} prompt tokens predicted cached on "
                f"the engine chosen, {num(f.get('prefix_lost_tokens'), 0)} of them recomputed")
    if "kv_decisions" in result:
        outcomes = ", ".join(f"{n} {k}" for k, n in sorted(result["kv_decisions"].items()))
        return f"{result['label']}: decisions by outcome: {outcomes or 'none logged'}"
    return None


def facts(meta: Mapping[str, Any]) -> list[str]:
    return [
        f"- run: {meta['date']}, `{meta['command']}`",
        f"- engines: 2 × vLLM {meta.get('vllm', 'unknown')} (CPU), SmolLM2-135M, "
        f"{meta['kv_blocks']} KV blocks of {meta['block_tokens']} tokens each "
        f"({meta['kv_blocks'] * meta['block_tokens']:,} tokens), one core each",
        f"- traffic: {meta['rate_rps']:g} req/s for {meta['duration_s']:g} s, at most "
        f"{meta['requests']} requests, seed {meta['seed']}; prefix share by construction "
        f"f = {meta['f_theory']:.3f} (4-character estimate)",
        f"- ridge {meta['ridge']}; vLLM router {meta['vllm_router']}; machine: {meta['machine']}",
    ]


def markdown(payload: Mapping[str, Any]) -> str:
    """The generated block's text."""
    meta, results = payload["meta"], payload["results"]
    own = [line for r in results if (line := own_figures(r)) is not None]
    parts = [table(results, meta["endpoints"]), "", *(f"- {line}" for line in own), "",
             *facts(meta)]
    return "\n".join(parts)


def write_doc(doc: Path, payload: Mapping[str, Any]) -> None:
    write_block(doc, BEGIN, END, markdown(payload))
