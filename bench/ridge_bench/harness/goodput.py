"""Per-request outcomes of a benchmark run, and the arithmetic over them: SLOs, goodput,
throughput, percentiles, shares per pool.

Per request (a streamed chat completion), seconds from sending it: TTFT to the first chunk with
content, e2e to the end of the stream, TPOT = (e2e − TTFT) / (output tokens − 1) (0 for one
token or none: vLLM's benchmark definition). A request is *good* when it succeeded and meets
every bound of its :class:`Slo`.

Rates are per second of the arrival *window* (while the open-loop schedule offered requests),
and every request sent in it counts, whenever it ends: goodput = good requests / window,
throughput = successful requests (or their output tokens) / window. Percentiles are nearest
rank over successful requests. See docs/benchmarks/router.md#goodput-arithmetic.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ridge_bench.harness.route import Route


@dataclass(frozen=True, slots=True)
class Slo:
    """Service-level bounds, seconds (TPOT: seconds per output token)."""

    ttft_s: float
    tpot_s: float
    e2e_s: float


@dataclass(frozen=True, slots=True)
class RequestResult:
    """One request as the client saw it. ``sent_s``: seconds from the run's start. ``error``:
    None on success, else a short label (``HTTP 503``, ``timeout``, an exception's name).
    ``key``: the conversation's key and the turn's index (``agent-000012:3``; a trace's
    request ``trace-000042:0`` is its line in time order); ``endpoint``: ridge's
    ``x-ridge-endpoint`` header, the replica within its pool (None from other gateways)."""

    kind: str
    step: int
    sent_s: float
    error: str | None
    ttft_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    route: Route = field(default_factory=Route)
    key: str = ""
    endpoint: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot_s(self) -> float | None:
        """(e2e − TTFT) / (tokens − 1); 0 for one token or none; None if it did not succeed."""
        if not self.ok or self.e2e_s is None or self.ttft_s is None:
            return None
        if self.output_tokens <= 1:
            return 0.0
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


def in_simulated_time(result: RequestResult, speed: float) -> RequestResult:
    """``result`` with its times × ``speed``: wall seconds of a simulator run ``speed`` times
    faster than real time (``python -m backends.sim --speed``) back in simulated seconds."""
    def scaled(t: float | None) -> float | None:
        return None if t is None else t * speed

    return replace(result, sent_s=result.sent_s * speed, ttft_s=scaled(result.ttft_s),
                   e2e_s=scaled(result.e2e_s))


def record(result: RequestResult) -> dict[str, Any]:
    """One line of a run's per-request file (``ridge bench --requests-out``): the request's
    key, kind, load step, times [s], tokens, error, and where ridge sent it."""
    return {"key": result.key, "kind": result.kind, "step": result.step,
            "sent_s": result.sent_s, "error": result.error, "ttft_s": result.ttft_s,
            "tpot_s": result.tpot_s, "e2e_s": result.e2e_s,
            "prompt_tokens": result.prompt_tokens, "cached_tokens": result.cached_tokens,
            "output_tokens": result.output_tokens, "pool": result.route.pool,
            "endpoint": result.endpoint, "route": dict(result.route.fields)}


def write_records(path: Path, results: Iterable[RequestResult]) -> None:
    """Every result as one JSON line of :func:`record`, in the order given."""
    with path.open("w") as out:
        for result in results:
            out.write(json.dumps(record(result)) + "\n")


def meets(result: RequestResult, slo: Slo) -> bool:
    """Succeeded and within every bound."""
    tpot = result.tpot_s
    return (
        result.ok and result.ttft_s is not None and result.e2e_s is not None and tpot is not None
        and result.ttft_s <= slo.ttft_s and tpot <= slo.tpot_s and result.e2e_s <= slo.e2e_s
    )


def percentile(values: Iterable[float], p: float) -> float | None:
    """Nearest-rank p-th percentile (0 < p ≤ 100); None for no values."""
    if not 0 < p <= 100:
        raise ValueError("p must be in (0, 100]")
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1]


def shares(labels: Iterable[str | None]) -> dict[str, float]:
    """Fraction of each label among the non-None ones, largest first."""
    counts = Counter(label for label in labels if label is not None)
    total = sum(counts.values())
    return {k: v / total for k, v in counts.most_common()} if total else {}


@dataclass(frozen=True)
class Summary:
    """A run's (or one load step's) figures. Rates per second of ``window_s``; times seconds."""

    requests: int
    ok: int
    good: int
    window_s: float
    output_tokens: int
    errors: Mapping[str, int]
    ttft_p50: float | None
    ttft_p99: float | None
    tpot_p50: float | None
    tpot_p99: float | None
    e2e_p50: float | None
    e2e_p99: float | None
    pool_share: Mapping[str, float]
    lever_share: Mapping[str, float]
    reason_share: Mapping[str, float]

    @property
    def goodput(self) -> float:
        return self.good / self.window_s if self.window_s > 0 else 0.0

    @property
    def throughput_rps(self) -> float:
        return self.ok / self.window_s if self.window_s > 0 else 0.0

    @property
    def throughput_tps(self) -> float:
        return self.output_tokens / self.window_s if self.window_s > 0 else 0.0

    @property
    def attainment(self) -> float:
        """Fraction of the requests sent that were good."""
        return self.good / self.requests if self.requests else 0.0


def summarise(results: Sequence[RequestResult], slo: Slo, window_s: float) -> Summary:
    """The figures of ``results``, all sent within a window of ``window_s`` seconds."""
    done = [r for r in results if r.ok]
    ttft = [r.ttft_s for r in done if r.ttft_s is not None]
    tpot = [t for r in done if (t := r.tpot_s) is not None]
    e2e = [r.e2e_s for r in done if r.e2e_s is not None]
    return Summary(
        requests=len(results), ok=len(done), good=sum(meets(r, slo) for r in results),
        window_s=window_s, output_tokens=sum(r.output_tokens for r in done),
        errors=dict(Counter(r.error for r in results if r.error is not None)),
        ttft_p50=percentile(ttft, 50), ttft_p99=percentile(ttft, 99),
        tpot_p50=percentile(tpot, 50), tpot_p99=percentile(tpot, 99),
        e2e_p50=percentile(e2e, 50), e2e_p99=percentile(e2e, 99),
        pool_share=shares(r.route.pool for r in results),
        lever_share=shares(r.route.lever for r in results),
        reason_share=shares(r.route.reason for r in results),
    )


def step_windows(step_durations: Sequence[float], window_s: float) -> list[float]:
    """Each load step's share of the arrival window: steps run back to back, the window may end
    inside one (the request bound), later steps then get 0."""
    out, start = [], 0.0
    for duration in step_durations:
        out.append(max(0.0, min(start + duration, window_s) - start))
        start += duration
    return out
