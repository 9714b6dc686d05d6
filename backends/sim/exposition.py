"""``GET /metrics`` for a simulated engine: its metric table rendered from an engine snapshot.

Prometheus text format 0.0.4, written the way the Prometheus Python client writes it (counters as
``_total`` plus, where the engine has them, ``_created`` gauges; histograms as cumulative
``_bucket`` series, ``_count`` and ``_sum``). Gauges are read at scrape time; counters and
histograms are cumulative since the engine started. The tables are in
:mod:`backends.sim.metric_tables`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from backends.sim.metric_tables import Kind, MetricSpec, MetricTable
from backends.sim.stats import Histogram

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# -- rendering ---------------------------------------------------------------------------------


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _label_text(pairs: list[tuple[str, str]], sort: bool) -> str:
    if sort:
        pairs = sorted(pairs)
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


def _num(value: float) -> str:
    """A sample value the way the Prometheus Python client writes it (Go's float formatting:
    ``232.0``, ``1.7952551665720675e+09``, ``+Inf``)."""
    d = float(value)
    if d != d:
        return "NaN"
    if d in (float("inf"), float("-inf")):
        return "+Inf" if d > 0 else "-Inf"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return s


@dataclass(frozen=True, slots=True)
class Exposition:
    """Everything a render needs: the table, base label values per label set, the snapshot of
    values (gauges, counters, fan-out mappings, flags), histograms by stat name, start time."""

    table: MetricTable
    base_values: Mapping[str, str]
    snapshot: Mapping[str, Any]
    histograms: Mapping[str, Histogram]
    created: float


def render(exp: Exposition, names: frozenset[str] | None = None) -> str:
    """The whole ``/metrics`` page; with ``names``, only the families that have a sample of
    one of those names (what a reader parses of it)."""
    lines: list[str] = []
    for spec in exp.table.specs:
        if spec.only_if is not None and not exp.snapshot.get(spec.only_if):
            continue
        if names is not None and names.isdisjoint(sample_names(spec)):
            continue
        lines.extend(_RENDERERS[spec.kind](exp, spec))
    return "\n".join(lines) + "\n"


def sample_names(spec: MetricSpec) -> tuple[str, ...]:
    """The names of the samples ``spec``'s family writes (``_created`` left out)."""
    if spec.kind == "counter":
        return (spec.name + "_total",)
    if spec.kind == "histogram":
        return (spec.name + "_bucket", spec.name + "_count", spec.name + "_sum")
    return (spec.name,)


def _series(exp: Exposition, spec: MetricSpec) -> Iterator[tuple[list[tuple[str, str]], Any]]:
    base = [(k, exp.base_values[k]) for k in exp.table.label_sets[spec.labels]]
    value = exp.snapshot.get(spec.source, 0.0)
    if spec.fanout is None:
        yield base, value
        return
    for key, v in value.items():
        yield [*base, (spec.fanout, str(key))], v


def _header(name: str, help_: str, kind: str) -> list[str]:
    return [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]


def _render_gauge(exp: Exposition, spec: MetricSpec) -> list[str]:
    out = _header(spec.name, spec.help, "gauge")
    sort = exp.table.sort_labels
    out += [f"{spec.name}{_label_text(lbl, sort)} {_num(v)}" for lbl, v in _series(exp, spec)]
    return out


def _render_counter(exp: Exposition, spec: MetricSpec) -> list[str]:
    total = spec.name + "_total"
    sort = exp.table.sort_labels
    series = list(_series(exp, spec))
    out = _header(total, spec.help, "counter")
    out += [f"{total}{_label_text(lbl, sort)} {_num(v)}" for lbl, v in series]
    if exp.table.created_series:
        created = spec.name + "_created"
        out += _header(created, spec.help, "gauge")
        out += [f"{created}{_label_text(lbl, sort)} {_num(exp.created)}" for lbl, _ in series]
    return out


def _render_histogram(exp: Exposition, spec: MetricSpec) -> list[str]:
    hist = exp.histograms.get(spec.source)
    if hist is None:
        return []
    sort = exp.table.sort_labels
    base = [(k, exp.base_values[k]) for k in exp.table.label_sets[spec.labels]]
    out = _header(spec.name, spec.help, "histogram")
    for edge, count in hist.cumulative():
        le = "+Inf" if edge == float("inf") else _num(edge)
        out.append(f"{spec.name}_bucket{_label_text([*base, ('le', le)], sort)} {_num(count)}")
    out.append(f"{spec.name}_count{_label_text(base, sort)} {_num(hist.count)}")
    out.append(f"{spec.name}_sum{_label_text(base, sort)} {_num(hist.sum)}")
    if exp.table.created_series:
        created = spec.name + "_created"
        out += _header(created, spec.help, "gauge")
        out.append(f"{created}{_label_text(base, sort)} {_num(exp.created)}")
    return out


def _render_info(exp: Exposition, spec: MetricSpec) -> list[str]:
    base = [(k, exp.base_values[k]) for k in exp.table.label_sets[spec.labels]]
    info: Mapping[str, str] = exp.snapshot.get(spec.source, {})
    labels = _label_text([*base, *info.items()], exp.table.sort_labels)
    return [*_header(spec.name, spec.help, "gauge"), f"{spec.name}{labels} 1.0"]


_RENDERERS: Mapping[Kind, Callable[[Exposition, MetricSpec], list[str]]] = MappingProxyType(
    {
        "gauge": _render_gauge,
        "counter": _render_counter,
        "histogram": _render_histogram,
        "info": _render_info,
    }
)
