"""Read an engine's Prometheus ``/metrics`` page into a normalised :class:`EngineMetrics`.

Parsing: the Prometheus text exposition format (version 0.0.4, as prometheus_client writes it)
with a one-regex-per-line parser of our own. It checks every line's full syntax (labels
included) but builds label dictionaries only for the metrics a dialect reads; it reads the same
samples as ``prometheus_client.parser`` (``tests/unit/backends/engines/test_scrape.py``), and
what it saves is measured in docs/benchmarks/overhead.md.

Grammar of a sample line: ``name{label="value",...} value [timestamp]``. ``#`` lines (HELP,
TYPE, comments) and blank lines are skipped. Values may be ``NaN``, ``+Inf`` and ``-Inf``.

Robustness rules:
- a line that is not a sample, a bad value or a bad label block raises
  :class:`MetricsParseError` naming the line; so does a page with no sample at all (an HTML
  error page or an empty body);
- metrics no reading asks for are ignored, so a newer engine with more metrics still parses;
- a metric the page lacks, a NaN/infinite value or an unusable label value (``"None"``) leaves
  the field ``None``: the engine does not say.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from backends.engines.dialects import Aggregate, EngineDialect, Reading
from routing.snapshots import EngineMetrics

_LABEL_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
_LABEL_VALUE = r'"(?:[^"\\]|\\.)*"'  # double-quoted, backslash escapes
_PAIR = rf"[ \t]*{_LABEL_NAME}[ \t]*=[ \t]*{_LABEL_VALUE}[ \t]*"
_SAMPLE_LINE = re.compile(
    r"([a-zA-Z_:][a-zA-Z0-9_:]*)"  # metric name
    rf"(?:\{{((?:{_PAIR},)*(?:{_PAIR})?)\}})?"  # label block, trailing comma allowed
    r"[ \t]+([^ \t]+)"  # value
    r"(?:[ \t]+-?[0-9]+)?[ \t]*"  # optional timestamp (milliseconds)
)
_LABEL = re.compile(rf"({_LABEL_NAME})[ \t]*=[ \t]*({_LABEL_VALUE})")
_UNESCAPE = re.compile(r"\\(.)")
_ESCAPES: Mapping[str, str] = MappingProxyType({"n": "\n", "\\": "\\", '"': '"'})

_AGGREGATES: Mapping[Aggregate, Callable[[Sequence[float]], float]] = MappingProxyType(
    {Aggregate.SUM: math.fsum, Aggregate.MEAN: statistics.fmean, Aggregate.MAX: max}
)


class MetricsParseError(ValueError):
    """The page is not Prometheus text exposition; the message names the line."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample line: its name, its labels and its value."""

    name: str
    labels: Mapping[str, str]
    value: float


def parse_samples(text: str, names: Collection[str] | None = None) -> list[Sample]:
    """Every sample on the page (only those named in ``names`` when given).

    Every line is syntax-checked even when its sample is skipped.
    """
    samples: list[Sample] = []
    seen = 0
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE_LINE.fullmatch(line)
        if match is None:
            raise MetricsParseError(f"line {lineno}: not a sample line: {line[:80]!r}")
        seen += 1
        name, label_block, value_text = match.groups()
        value = _value(value_text, lineno)
        if names is None or name in names:
            samples.append(Sample(name, _labels(label_block or ""), value))
    if seen == 0:
        raise MetricsParseError("no samples on the page")
    return samples


def _value(text: str, lineno: int) -> float:
    try:
        return float(text)
    except ValueError:
        raise MetricsParseError(f"line {lineno}: not a number: {text[:40]!r}") from None


def _labels(block: str) -> Mapping[str, str]:
    """Labels of a block :data:`_SAMPLE_LINE` has already validated."""
    return {m[1]: _UNESCAPE.sub(_unescape_one, m[2][1:-1]) for m in _LABEL.finditer(block)}


def _unescape_one(match: re.Match[str]) -> str:
    char = match.group(1)
    return _ESCAPES.get(char, "\\" + char)


def normalise(text: str, dialect: EngineDialect) -> EngineMetrics:
    """The page's figures as :class:`EngineMetrics`, read as ``dialect`` says.

    Raises :class:`MetricsParseError` for a page that is not Prometheus text.
    """
    by_name: dict[str, list[Sample]] = {}
    for sample in parse_samples(text, dialect.metric_names()):
        by_name.setdefault(sample.name, []).append(sample)
    values: dict[str, Any] = {r.field: read(r, by_name.get(r.metric, ())) for r in dialect.readings}
    return EngineMetrics(**values)


def read(reading: Reading, samples: Sequence[Sample]) -> float | int | None:
    """Combine one metric's samples (all its label sets) as ``reading`` says; None if none."""
    numbers = [n for n in (_number(reading, s) for s in samples) if n is not None]
    if not numbers:
        return None
    combined = _AGGREGATES[reading.aggregate](numbers)
    return round(combined) if reading.integer else combined


def _number(reading: Reading, sample: Sample) -> float | None:
    if reading.label is None:
        value = sample.value
    else:
        try:
            value = float(sample.labels.get(reading.label, "nan"))
        except ValueError:  # info labels such as num_gpu_blocks="None"
            return None
    return value if math.isfinite(value) else None
