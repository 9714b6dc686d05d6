"""Sliding windows over the recent requests: prefix share, length distributions, output mean.

Count windows: the last ``size`` requests, not the last T seconds — no clock, fixed memory, and
never empty after a lull (``size``: :class:`routing.state.memory.StateLimits`'s
``window_requests``, 1000 by default). :class:`CountWindow` keeps integer observations and
their running sum (exact, no drift; quantiles by nearest rank); :class:`PairWindow` the same
over pairs observed together; :class:`ScopeWindows` one scope's prompt, matched and output
tokens, its prefix share f = Σ matched ÷ Σ prompt over the same requests and its output mean
(the running output estimate); :class:`WorkloadWindows` the overall scope plus one per model
(an LRU of ``max_models``). :class:`WorkloadMeasures`: what telemetry shows of them. Units:
tokens; f a fraction in [0, 1].

See docs/routing.md#workload-windows.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from routing.load import InFlight


@dataclass(frozen=True, slots=True)
class LengthSummary:
    """A length distribution (tokens): observations, mean, median, 90th percentile."""

    count: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None


@dataclass(frozen=True, slots=True)
class WindowMeasures:
    """Measures over the recent requests of one scope (all models, or one model).

    ``requests``: requests in the window; ``prefix_share``: f in [0, 1] (None before any
    prompt token); ``output_tokens.mean`` is the running output-length estimate (tokens).
    """

    requests: int = 0
    prefix_share: float | None = None
    prompt_tokens: LengthSummary = field(default_factory=LengthSummary)
    output_tokens: LengthSummary = field(default_factory=LengthSummary)


@dataclass(frozen=True, slots=True)
class WorkloadMeasures:
    """What the telemetry shows of the workload: ``overall`` and ``by_model`` window
    measures over the last ``window`` requests, and the ``in_flight`` counts per endpoint URL
    the router routes by."""

    window: int
    overall: WindowMeasures = field(default_factory=WindowMeasures)
    by_model: Mapping[str, WindowMeasures] = field(default_factory=dict)
    in_flight: InFlight = field(default_factory=dict)


def nearest_rank(sorted_values: list[int], q: float) -> float | None:
    """The q-quantile (0 < q ≤ 1) of ascending ``sorted_values`` by nearest rank."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return float(sorted_values[rank - 1])


class CountWindow:
    """The last ``size`` integer observations, with their running sum."""

    __slots__ = ("_values", "_size", "_total")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("window size must be >= 1")
        self._values: deque[int] = deque(maxlen=size)
        self._size = size
        self._total = 0

    def add(self, value: int) -> None:
        values = self._values
        if len(values) == self._size:
            self._total = self._total - values[0] + value  # the oldest leaves
        else:
            self._total += value
        values.append(value)

    def __len__(self) -> int:
        return len(self._values)

    @property
    def total(self) -> int:
        return self._total

    def mean(self) -> float | None:
        return self._total / len(self._values) if self._values else None

    def summary(self) -> LengthSummary:
        """Count, mean, p50 and p90 of the window."""
        return length_summary(sorted(self._values))


def length_summary(ordered: list[int]) -> LengthSummary:
    """Count, mean, p50 and p90 of ascending ``ordered``."""
    mean = sum(ordered) / len(ordered) if ordered else None
    return LengthSummary(count=len(ordered), mean=mean, p50=nearest_rank(ordered, 0.5),
                         p90=nearest_rank(ordered, 0.9))


class PairWindow:
    """The last ``size`` pairs of integer observations, with each column's running sum."""

    __slots__ = ("_pairs", "_size", "_first", "_second")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("window size must be >= 1")
        self._pairs: deque[tuple[int, int]] = deque(maxlen=size)
        self._size = size
        self._first = self._second = 0

    def add(self, first: int, second: int) -> None:
        pairs = self._pairs
        if len(pairs) == self._size:
            old_first, old_second = pairs[0]  # the oldest leaves
            self._first += first - old_first
            self._second += second - old_second
        else:
            self._first += first
            self._second += second
        pairs.append((first, second))

    def __len__(self) -> int:
        return len(self._pairs)

    @property
    def totals(self) -> tuple[int, int]:
        """The sums of the first and of the second observations."""
        return self._first, self._second

    def firsts(self) -> list[int]:
        """The first observations, oldest first."""
        return [first for first, _ in self._pairs]


class ScopeWindows:
    """Prefix share, prompt and output lengths over the last ``size`` requests of a scope."""

    __slots__ = ("_prompt", "_output")

    def __init__(self, size: int) -> None:
        self._prompt = PairWindow(size)  # (prompt tokens, matched prompt tokens)
        self._output = CountWindow(size)

    def observe(self, prompt_tokens: int, matched_tokens: int, output_tokens: int | None) -> None:
        """One finished request; ``matched_tokens`` is clamped to [0, prompt_tokens]."""
        prompt = prompt_tokens if prompt_tokens > 0 else 0
        matched = matched_tokens if matched_tokens > 0 else 0
        self._prompt.add(prompt, matched if matched < prompt else prompt)
        if output_tokens is not None and output_tokens >= 0:
            self._output.add(output_tokens)

    def prefix_share(self) -> float | None:
        """f = Σ matched ÷ Σ prompt tokens over the window; None before any prompt token."""
        total, matched = self._prompt.totals
        return matched / total if total else None

    def mean_output(self) -> float | None:
        """Mean output tokens over the window; None before any known output."""
        return self._output.mean()

    def measures(self) -> WindowMeasures:
        return WindowMeasures(requests=len(self._prompt), prefix_share=self.prefix_share(),
                              prompt_tokens=length_summary(sorted(self._prompt.firsts())),
                              output_tokens=self._output.summary())


class WorkloadWindows:
    """An overall scope and a bounded LRU of per-model scopes."""

    __slots__ = ("_size", "_max_models", "_overall", "_models")

    def __init__(self, size: int, max_models: int) -> None:
        if max_models < 1:
            raise ValueError("max_models must be >= 1")
        self._size = size
        self._max_models = max_models
        self._overall = ScopeWindows(size)
        self._models: OrderedDict[str, ScopeWindows] = OrderedDict()

    @property
    def size(self) -> int:
        return self._size

    def _scope(self, model: str) -> ScopeWindows:
        scope = self._models.get(model)
        if scope is None:
            scope = self._models[model] = ScopeWindows(self._size)
            while len(self._models) > self._max_models:
                self._models.popitem(last=False)
        self._models.move_to_end(model)
        return scope

    def observe(self, model: str, prompt_tokens: int, matched_tokens: int,
                output_tokens: int | None) -> None:
        self._overall.observe(prompt_tokens, matched_tokens, output_tokens)
        self._scope(model).observe(prompt_tokens, matched_tokens, output_tokens)

    def prefix_share(self, model: str) -> float | None:
        scope = self._models.get(model)
        return scope.prefix_share() if scope else None

    def mean_output(self, model: str) -> float | None:
        scope = self._models.get(model)
        return scope.mean_output() if scope else None

    def models(self) -> int:
        return len(self._models)

    def overall(self) -> WindowMeasures:
        return self._overall.measures()

    def by_model(self) -> dict[str, WindowMeasures]:
        return {model: scope.measures() for model, scope in self._models.items()}
