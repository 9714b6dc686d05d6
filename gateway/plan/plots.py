"""The plan's pictures, as PNG files beside its fleet file (matplotlib, ``ridge[plan]``).

:func:`cost_against_ttft`: every candidate replayed on the whole trace, cost per million
tokens against p99 TTFT, the plan marked; :func:`goodput_against_gpus`: each contender of a
comparison (:mod:`gateway.plan.compare`), goodput against GPUs, one panel per load scale.
Both raise :class:`PlotsUnavailable` without matplotlib. docs/planning.md#reading-a-plan.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.plan.compare import CONTENDERS, PLAN, Point
from gateway.plan.search import Result


class PlotsUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotsUnavailable("plots need matplotlib: pip install 'ridge[plan]'") from None
    return plt


def cost_against_ttft(results: Sequence[Result], path: Path, labelled: int = 1) -> Path:
    """Cost per million tokens against p99 TTFT [s] for every result (those with no good
    request left out: their cost is infinite), the first (the plan) marked."""
    plt = _pyplot()
    shown = [r for r in results if math.isfinite(r.score.cost_per_mtok)
             and math.isfinite(r.score.ttft_p99)]
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    ax.scatter([r.score.ttft_p99 for r in shown], [r.score.cost_per_mtok for r in shown],
               s=18, color="#7f8c8d", label="candidates")
    if shown and shown[0] is results[0]:
        best = shown[0].score
        ax.scatter([best.ttft_p99], [best.cost_per_mtok], s=80, color="#c0392b", label="plan")
    for r in shown[:labelled]:
        ax.annotate(r.candidate.label, (r.score.ttft_p99, r.score.cost_per_mtok), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("p99 TTFT [s]")
    ax.set_ylabel("cost per million output tokens of good requests [$]")
    ax.set_title("candidates replayed on the whole trace")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def goodput_against_gpus(points: Sequence[Point], path: Path) -> Path:
    """Goodput [req/s] against GPUs per contender, one panel per load scale."""
    plt = _pyplot()
    scales = sorted({p.scale for p in points})
    fig, axes = plt.subplots(1, len(scales), figsize=(5 * len(scales), 4), dpi=110,
                             squeeze=False)
    for ax, scale in zip(axes[0], scales, strict=True):
        for name in CONTENDERS:
            mine = sorted((p.gpus, p.result.score.goodput) for p in points
                          if p.contender == name and p.scale == scale)
            if mine:  # the plan dashed on top: it may be the best uniform fleet itself
                ax.plot([g for g, _ in mine], [v for _, v in mine], marker="o", label=name,
                        linestyle="--" if name == PLAN else "-", zorder=3 if name == PLAN else 2)
        ax.set_title(f"arrivals x{scale:g}")
        ax.set_xlabel("GPUs")
        ax.set_ylabel("goodput [good req/s]")
        ax.grid(alpha=0.3)
    axes[0][0].legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
