"""The benchmarks' pictures: PNG plots drawn from a run's saved data (matplotlib).

Each figure function takes plain data and writes one PNG at ``path``, returning it, or None
(nothing written) when there is nothing to draw: per-request :class:`Sample` values (from a
run's request records, :func:`read_samples`) for TTFT/TPOT over time and their CDFs by pool
and the outcomes (answered, refused 503, failed) over time; named figures for goodput per
pool, the engines' prefix-cache hit rate per replica, grouped bars and curves against a rate.
:func:`draw_run` draws one run's set from its JSON report (``report_dict``) and records.
Without matplotlib every figure raises :class:`PlotsUnavailable`.
See docs/benchmarks/README.md#plots.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

REFUSED = "HTTP 503"
WIDTH_IN, HEIGHT_IN, DPI = 8.2, 4.4, 110  # about 900 px wide
Metric = Literal["ttft", "tpot"]
_METRIC = {"ttft": ("TTFT", "s", 1.0), "tpot": ("TPOT", "ms", 1e3)}  # name, unit, scale
_OUTCOMES = (("answered", "#4c72b0"), ("refused: 503", "#c44e52"), ("failed", "#8c8c8c"))


class PlotsUnavailable(RuntimeError):
    """matplotlib is not installed."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One request: sent ``sent_s`` seconds into the run, to ``pool`` (``-``: none named);
    ``error`` None when answered, else its label (``HTTP 503`` a refusal); TTFT [s], TPOT
    [s/token] of an answered request."""

    sent_s: float
    pool: str = "-"
    error: str | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None


@dataclass(frozen=True, slots=True)
class Replica:
    """One engine endpoint's prefix-cache hit rate over a run (None: it looked nothing up)."""

    label: str
    pool: str
    hit_rate: float | None


@dataclass(frozen=True, slots=True)
class RatePoint:
    """One run of a sweep: its series (e.g. ``admission off``), offered rate [req/s], TTFT
    p50/p99 of the answered requests [s], and requests sent, refused and failed."""

    series: str
    rate: float
    ttft_p50: float | None
    ttft_p99: float | None
    sent: int = 0
    refused: int = 0
    failed: int = 0
    label: str = ""


def sample_of(record: Mapping[str, Any]) -> Sample:
    """A sample from one request record (:func:`ridge_bench.harness.goodput.record`)."""
    return Sample(float(record["sent_s"]), str(record.get("pool") or "-"), record.get("error"),
                  record.get("ttft_s"), record.get("tpot_s"))


def read_samples(path: Path) -> list[Sample]:
    """The samples of a request-records file (one JSON line each); [] when it is absent."""
    if not path.is_file():
        return []
    return [sample_of(json.loads(line)) for line in path.read_text().splitlines() if line]


def slug(text: str) -> str:
    """``text`` as a file-name part: runs of other than letters, digits, ``.`` and ``_``
    become ``-`` (``plain:ridge`` → ``plain-ridge``)."""
    return re.sub(r"[^A-Za-z0-9._]+", "-", text).strip("-")


def plot_dir(value: str | None, default: Path) -> Path | None:
    """A ``--plots`` value: the folder given, ``default`` when not given, None for ''."""
    if value is None:
        return default
    return Path(value) if value else None


def draw_or_say(draw: Callable[[], Sequence[Path]], prog: str) -> list[Path]:
    """``draw()``'s paths, saying on stderr how many it wrote where, or why it wrote none
    (matplotlib missing: [] then, the run's results stand without their plots)."""
    try:
        drawn = list(draw())
    except PlotsUnavailable as exc:
        print(f"{prog}: no plots: {exc}", file=sys.stderr)
        return []
    where = ", ".join(sorted({str(p.parent) for p in drawn})) or "-"
    print(f"{prog}: {len(drawn)} plots in {where}", file=sys.stderr)
    return drawn


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotsUnavailable("plots need matplotlib: pip install matplotlib") from None
    return plt


_PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3",
            "#8c8c8c", "#ccb974", "#64b5cd")


def _colours(names: Iterable[str], ordered: bool = False) -> dict[str, str]:
    """One colour per name, in sorted order (the same pool keeps its colour across figures)
    or, ``ordered``, in the order given."""
    unique = list(dict.fromkeys(names))
    return {n: _PALETTE[i % len(_PALETTE)]
            for i, n in enumerate(unique if ordered else sorted(unique))}


def _figure(plt: Any, panels: int = 1) -> tuple[Any, Any]:
    fig, axes = plt.subplots(1, panels, figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI, squeeze=False)
    return fig, axes[0] if panels > 1 else axes[0][0]


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _values(samples: Iterable[Sample], metric: Metric) -> list[tuple[Sample, float]]:
    """Answered samples with their metric, in the metric's display unit."""
    scale = _METRIC[metric][2]
    out = []
    for s in samples:
        value = s.ttft_s if metric == "ttft" else s.tpot_s
        if s.error is None and value is not None:
            out.append((s, value * scale))
    return out


def _log_scale(values: Sequence[float]) -> bool:
    """Log axis when the positive values span more than 1.5 decades."""
    positive = [v for v in values if v > 0]
    return len(positive) > 1 and max(positive) / min(positive) > 10 ** 1.5


def latency_over_time(samples: Sequence[Sample], metric: Metric, slo_s: float | None,
                      path: Path, title: str) -> Path | None:
    """TTFT or TPOT of each answered request against when it was sent, one colour per pool,
    the SLO as a dashed line; None without an answered request."""
    shown = _values(samples, metric)
    if not shown:
        return None
    name, unit, scale = _METRIC[metric]
    plt = _pyplot()
    fig, ax = _figure(plt)
    colours = _colours(s.pool for s, _ in shown)
    for pool, colour in colours.items():
        mine = [(s.sent_s, v) for s, v in shown if s.pool == pool]
        ax.scatter([t for t, _ in mine], [v for _, v in mine], s=7, alpha=0.6, color=colour,
                   label=f"{pool} ({len(mine)})", linewidths=0)
    if slo_s is not None:
        ax.axhline(slo_s * scale, color="#c0392b", linestyle="--", linewidth=1.2,
                   label=f"SLO {slo_s * scale:g} {unit}")
    if _log_scale([v for _, v in shown]):
        ax.set_yscale("log")
    ax.set_xlabel("request sent at [s from the run's start]")
    ax.set_ylabel(f"{name} [{unit}]")
    ax.set_title(f"{title}: {name} over time, by pool")
    ax.legend(loc="best", fontsize=8, markerscale=2)
    ax.grid(alpha=0.3)
    return _save(plt, fig, path)


def latency_cdf(samples: Sequence[Sample], metric: Metric, slo_s: float | None, path: Path,
                title: str) -> Path | None:
    """The CDF of TTFT or TPOT per pool (and of all requests when there are several pools),
    the SLO as a dashed line; None without an answered request."""
    shown = _values(samples, metric)
    if not shown:
        return None
    name, unit, scale = _METRIC[metric]
    plt = _pyplot()
    fig, ax = _figure(plt)
    colours = _colours(s.pool for s, _ in shown)
    curves = [(f"{p} ({n})", c, sorted(v for s, v in shown if s.pool == p))
              for p, c in colours.items() if (n := sum(s.pool == p for s, _ in shown))]
    if len(colours) > 1:
        curves.append((f"all ({len(shown)})", "#222222", sorted(v for _, v in shown)))
    for label, colour, values in curves:
        ys = [(i + 1) / len(values) for i in range(len(values))]
        ax.step(values, ys, where="post", color=colour, label=label,
                linewidth=2.0 if label.startswith("all") else 1.4)
    if slo_s is not None:
        ax.axvline(slo_s * scale, color="#c0392b", linestyle="--", linewidth=1.2,
                   label=f"SLO {slo_s * scale:g} {unit}")
    if _log_scale([v for _, v in shown]):
        ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(f"{name} [{unit}]")
    ax.set_ylabel("fraction of answered requests")
    ax.set_title(f"{title}: {name} CDF, by pool")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    return _save(plt, fig, path)


def _bin_width(span_s: float, bins: int = 30) -> float:
    """A round bin width (1, 2 or 5 × 10^k s) giving about ``bins`` bins over ``span_s``."""
    raw = max(span_s, 1e-9) / bins
    base = 10.0 ** math.floor(math.log10(raw))
    return next(float(m * base) for m in (1, 2, 5, 10) if m * base >= raw)


def outcomes_over_time(samples: Sequence[Sample], path: Path, title: str) -> Path | None:
    """Requests sent per time bin, stacked by outcome: answered, refused (503), failed (any
    other error); None without a sample. A run with no refusal draws no red."""
    if not samples:
        return None
    width = _bin_width(max(s.sent_s for s in samples))
    bins = int(max(s.sent_s for s in samples) // width) + 1
    counts = {name: [0] * bins for name, _ in _OUTCOMES}
    for s in samples:
        name = "answered" if s.error is None else \
            "refused: 503" if s.error == REFUSED else "failed"
        counts[name][int(s.sent_s // width)] += 1
    plt = _pyplot()
    fig, ax = _figure(plt)
    lefts = [i * width for i in range(bins)]
    bottom = [0] * bins
    for name, colour in _OUTCOMES:
        total = sum(counts[name])
        ax.bar(lefts, counts[name], width=width * 0.9, bottom=bottom, align="edge",
               color=colour, label=f"{name} ({total})")
        bottom = [b + c for b, c in zip(bottom, counts[name], strict=True)]
    ax.set_xlabel("request sent at [s from the run's start]")
    ax.set_ylabel(f"requests per {width:g} s")
    ax.set_title(f"{title}: refusals (503) over time")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return _save(plt, fig, path)


def goodput_per_pool(goodput: Mapping[str, float], path: Path, title: str,
                     throughput: Mapping[str, float] | None = None) -> Path | None:
    """Goodput per pool [req/s meeting every SLO bound], bars, beside the pool's throughput
    [answered req/s] when given; None without a pool."""
    if not goodput:
        return None
    series: dict[str, dict[str, float | None]] = {
        pool: {"goodput (met the SLOs)": value} for pool, value in goodput.items()}
    if throughput is not None:
        for pool in series:
            series[pool]["throughput (answered)"] = throughput.get(pool)
    return grouped_bars(series, path, f"{title}: goodput per pool", "requests/s",
                        xlabel="pool")


def hit_rate_per_replica(replicas: Sequence[Replica], path: Path, title: str,
                         fleet: float | None = None) -> Path | None:
    """Each replica's engine prefix-cache hit rate, bars coloured by pool, the fleet's as a
    dashed line; None when no replica has a hit rate."""
    if not any(r.hit_rate is not None for r in replicas):
        return None
    plt = _pyplot()
    fig, ax = _figure(plt)
    colours = _colours(r.pool for r in replicas)
    xs = range(len(replicas))
    ax.bar(list(xs), [r.hit_rate or 0.0 for r in replicas],
           color=[colours[r.pool] for r in replicas])
    for pool, colour in colours.items():
        ax.bar([0], [0], color=colour, label=pool)  # a legend entry per pool
    for x, r in zip(xs, replicas, strict=True):
        if r.hit_rate is None:
            ax.annotate("no lookups", (x, 0.01), ha="center", fontsize=7, rotation=90)
    if fleet is not None:
        ax.axhline(fleet, color="#222222", linestyle="--", linewidth=1.2,
                   label=f"fleet {fleet:.2f}")
    ax.set_xticks(list(xs), [r.label for r in replicas], rotation=45 if len(replicas) > 8
                  else 0, ha="right" if len(replicas) > 8 else "center", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_xlabel("replica (pool/index)")
    ax.set_ylabel("prompt tokens served from cache [fraction]")
    ax.set_title(f"{title}: engine prefix-cache hit rate per replica")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return _save(plt, fig, path)


def _short(value: float) -> str:
    """A bar's label: thousands separated from 100 on, else three significant digits."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def grouped_bars(values: Mapping[str, Mapping[str, float | None]], path: Path, title: str,
                 ylabel: str, xlabel: str = "", line: tuple[str, float] | None = None,
                 log: bool = False) -> Path | None:
    """Bars per group (the outer keys) and series (the inner keys; a missing or None value
    leaves a gap), each bar labelled with its value, ``line`` (label, y) as a dashed line;
    None without a value."""
    series = list(dict.fromkeys(k for inner in values.values() for k in inner))
    if not any(v is not None for inner in values.values() for v in inner.values()):
        return None
    plt = _pyplot()
    fig, ax = _figure(plt)
    colours = _colours(series, ordered=True)
    width = 0.8 / max(len(series), 1)
    groups = list(values)
    for j, name in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(groups))]
        ys = [values[g].get(name) for g in groups]
        bars = ax.bar([x for x, y in zip(xs, ys, strict=True) if y is not None],
                      [y for y in ys if y is not None], width=width * 0.95,
                      color=colours[name], label=name)
        ax.bar_label(bars, labels=[_short(y) for y in ys if y is not None], fontsize=7,
                     padding=1)
    if line is not None:
        ax.axhline(line[1], color="#c0392b", linestyle="--", linewidth=1.2,
                   label=f"{line[0]} {line[1]:.3g}")
    if log:
        ax.set_yscale("log")
    ax.set_xticks(range(len(groups)), groups, fontsize=8,
                  rotation=20 if sum(len(g) for g in groups) > 70 else 0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(series) > 1 or line is not None:
        ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return _save(plt, fig, path)


def ttft_against_rate(points: Sequence[RatePoint], slo_s: float | None, path: Path,
                      title: str) -> Path | None:
    """TTFT p50 (solid) and p99 (dotted) against the offered rate, one colour per series, the
    SLO as a dashed line; None without a TTFT."""
    known = [p for p in points if p.ttft_p50 is not None or p.ttft_p99 is not None]
    if not known:
        return None
    plt = _pyplot()
    fig, ax = _figure(plt)
    colours = _colours(p.series for p in known)
    for series, colour in colours.items():
        mine = sorted((p for p in known if p.series == series), key=lambda p: p.rate)
        for pct, style, marker in (("p50", "-", "o"), ("p99", ":", "^")):
            pts = [(p.rate, getattr(p, f"ttft_{pct}")) for p in mine]
            pts = [(x, y) for x, y in pts if y is not None]
            ax.plot([x for x, _ in pts], [y for _, y in pts], linestyle=style, marker=marker,
                    color=colour, label=f"{series}, {pct}")
    if slo_s is not None:
        ax.axhline(slo_s, color="#c0392b", linestyle="--", linewidth=1.2,
                   label=f"SLO {slo_s:g} s")
    if _log_scale([v for p in known for v in (p.ttft_p50, p.ttft_p99) if v is not None]):
        ax.set_yscale("log")
    ax.set_xlabel("offered load [req/s]")
    ax.set_ylabel("TTFT of the answered requests [s]")
    ax.set_title(f"{title}: TTFT p50 / p99 against the offered load")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    return _save(plt, fig, path)


def outcomes_per_run(points: Sequence[RatePoint], path: Path, title: str) -> Path | None:
    """Requests sent per run, stacked: answered, refused (503), failed; None without a run."""
    if not points:
        return None
    plt = _pyplot()
    fig, ax = _figure(plt)
    labels = [p.label or f"{p.series} @ {p.rate:g}" for p in points]
    parts = {"answered": [p.sent - p.refused - p.failed for p in points],
             "refused: 503": [p.refused for p in points],
             "failed": [p.failed for p in points]}
    bottom = [0] * len(points)
    for name, colour in _OUTCOMES:
        bars = ax.bar(labels, parts[name], bottom=bottom, color=colour,
                      label=f"{name} ({sum(parts[name])})")
        ax.bar_label(bars, labels=[str(v) if v else "" for v in parts[name]],
                     label_type="center", fontsize=7, color="white")
        bottom = [b + v for b, v in zip(bottom, parts[name], strict=True)]
    ax.set_ylabel("requests sent")
    ax.set_title(f"{title}: answered, refused (503) and failed per run")
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return _save(plt, fig, path)


def replicas_of(report: Mapping[str, Any]) -> tuple[list[Replica], float | None]:
    """The replicas of a run report's ``engine_prefix_cache`` (labelled ``pool/index`` where
    the report names each endpoint's pool, else by URL) and the fleet's hit rate."""
    cache = report.get("engine_prefix_cache") or {}
    out, seen = [], dict[str, int]()
    for url, use in (cache.get("endpoints") or {}).items():
        pool = str(use.get("pool") or "-")
        index = seen[pool] = seen.get(pool, -1) + 1
        queries, hits = use.get("queries_tokens") or 0, use.get("hits_tokens") or 0
        label = f"{pool}/{index}" if use.get("pool") else url.split("//")[-1]
        out.append(Replica(label, pool, hits / queries if queries > 0 else None))
    return out, cache.get("hit_rate")


def draw_requests(samples: Sequence[Sample], slo: Mapping[str, float], directory: Path,
                  prefix: str, title: str) -> list[Path]:
    """TTFT and TPOT over time and their CDFs, and the outcomes over time, as
    ``directory/{prefix}{ttft,tpot}-{time,cdf}.png`` and ``{prefix}refusals-time.png``
    (:func:`slug` of ``prefix``); the paths written."""
    name = slug(prefix) + "-" if prefix else ""
    drawn = [latency_over_time(samples, m, slo.get(f"{m}_s"), directory / f"{name}{m}-time.png",
                               title) for m in ("ttft", "tpot")]
    drawn += [latency_cdf(samples, m, slo.get(f"{m}_s"), directory / f"{name}{m}-cdf.png",
                          title) for m in ("ttft", "tpot")]
    drawn.append(outcomes_over_time(samples, directory / f"{name}refusals-time.png", title))
    return [p for p in drawn if p is not None]


def draw_run(report: Mapping[str, Any], samples: Sequence[Sample], directory: Path,
             prefix: str, title: str) -> list[Path]:
    """One run's set: :func:`draw_requests`, goodput per pool (``{prefix}goodput-pools.png``)
    and, where the report has the engines' counters, the hit rate per replica
    (``{prefix}hit-rate-replicas.png``), from a run report's JSON values
    (:func:`ridge_bench.compare.report.report_dict`); the paths written."""
    name = slug(prefix) + "-" if prefix else ""
    drawn = draw_requests(samples, report.get("slo") or {}, directory, prefix, title)
    pools = report.get("pools") or {}
    extra = [goodput_per_pool({k: v["goodput_rps"] for k, v in pools.items()},
                              directory / f"{name}goodput-pools.png", title,
                              {k: v["throughput_rps"] for k, v in pools.items()})]
    replicas, fleet = replicas_of(report)
    extra.append(hit_rate_per_replica(replicas, directory / f"{name}hit-rate-replicas.png",
                                      title, fleet))
    return drawn + [p for p in extra if p is not None]
