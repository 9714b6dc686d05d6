"""Service-level objectives and goodput: which bounds a finished request violated.

Goodput is the rate of finished requests that met EVERY bound of their SLO (DistServe's
definition): a request with time to first token ≤ ``ttft_s``, time per output token ≤
``tpot_s`` and end-to-end latency ≤ ``e2e_s`` [seconds] counts as good; otherwise each violated
bound is named (``ttft``, ``tpot``, ``e2e``). A bound that is not configured, or a figure that
was not measured (a non-streamed answer has no time to first token; one output token has no
time per output token), cannot be violated. A request the gateway failed (status ≥ 500) violates
``error``; client errors (4xx, 499 = the client went away) are not the service's doing and are
not evaluated.

Which SLO applies (:meth:`SloPolicy.bounds_for`):

1. the model's entry, else the ``*`` entry (every other model), else no SLO (nothing to violate);
2. inside it, the request class named by the client (the ``x-ridge-slo-class`` header, handed
   over as ``requested_class``) when the entry defines it; otherwise the class of the highest
   ``min_max_tokens`` band not above the request's ``max_tokens`` (bands by requested output
   length: a 4096-token answer may take longer end to end than a 64-token one); otherwise the
   entry's own bounds (class ``default``);
3. a class's unset bounds are inherited from its model entry.

Pure: no I/O and no clock; times are measured by the caller.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

TTFT = "ttft"
TPOT = "tpot"
E2E = "e2e"
ERROR = "error"
SLO_NAMES = (TTFT, TPOT, E2E, ERROR)
"""Every value of the ``slo`` label of ``ridge_slo_violations_total``."""

ANY_MODEL = "*"
DEFAULT_CLASS = "default"
SLO_CLASS_HEADER = "x-ridge-slo-class"


@dataclass(frozen=True, slots=True)
class Bounds:
    """Upper bounds [s]; None = no bound."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def over(self, base: Bounds) -> Bounds:
        """These bounds, each unset one taken from ``base``."""
        return Bounds(
            ttft_s=self.ttft_s if self.ttft_s is not None else base.ttft_s,
            tpot_s=self.tpot_s if self.tpot_s is not None else base.tpot_s,
            e2e_s=self.e2e_s if self.e2e_s is not None else base.e2e_s,
        )

    def by_name(self) -> dict[str, float]:
        """The set bounds by SLO name (``ttft``, ``tpot``, ``e2e``)."""
        pairs = ((TTFT, self.ttft_s), (TPOT, self.tpot_s), (E2E, self.e2e_s))
        return {name: value for name, value in pairs if value is not None}


@dataclass(frozen=True, slots=True)
class SloClass:
    """A request class: its name, the lowest ``max_tokens`` it covers (None = only when named
    by the client), and its bounds (unset ones inherited from the model)."""

    name: str
    bounds: Bounds
    min_max_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class ModelSlo:
    """One model's SLO: default bounds and optional request classes."""

    bounds: Bounds = Bounds()
    classes: tuple[SloClass, ...] = ()

    def resolve(self, max_tokens: int | None, requested_class: str | None
                ) -> tuple[str, Bounds]:
        """(class name, effective bounds) for one request (rules in the module docstring)."""
        named = {c.name: c for c in self.classes}
        chosen = named.get(requested_class) if requested_class else None
        if chosen is None and max_tokens is not None:
            bands = [c for c in self.classes
                     if c.min_max_tokens is not None and c.min_max_tokens <= max_tokens]
            chosen = max(bands, key=lambda c: c.min_max_tokens or 0, default=None)
        if chosen is None:
            return DEFAULT_CLASS, self.bounds
        return chosen.name, chosen.bounds.over(self.bounds)


@dataclass(frozen=True, slots=True)
class SloPolicy:
    """Every model's SLO, by model name (``*`` = every model not listed)."""

    models: Mapping[str, ModelSlo] = field(default_factory=lambda: MappingProxyType({}))

    def bounds_for(self, model: str, max_tokens: int | None = None,
                   requested_class: str | None = None) -> tuple[str, Bounds]:
        """(class name, bounds) for a request; no SLO → (``default``, no bounds)."""
        slo = self.models.get(model) or self.models.get(ANY_MODEL)
        if slo is None:
            return DEFAULT_CLASS, Bounds()
        return slo.resolve(max_tokens, requested_class)

    def class_names(self) -> frozenset[str]:
        """Every class label value this policy can produce."""
        return frozenset({DEFAULT_CLASS}) | {
            c.name for slo in self.models.values() for c in slo.classes
        }


@dataclass(frozen=True, slots=True)
class Measured:
    """What was measured of one finished request [s]; None = not measured."""

    status: int
    e2e_s: float
    ttft_s: float | None = None
    tpot_s: float | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    """``evaluated``: the request counts toward goodput at all; ``violated``: bound names."""

    evaluated: bool
    violated: tuple[str, ...] = ()

    @property
    def good(self) -> bool:
        return self.evaluated and not self.violated


NOT_EVALUATED = Verdict(evaluated=False)


def evaluate(bounds: Bounds, measured: Measured) -> Verdict:
    """Which of ``bounds`` the request broke (a bound is met when the figure is ≤ it)."""
    if measured.status >= 500:
        return Verdict(True, (ERROR,))
    if not 200 <= measured.status < 300:
        return NOT_EVALUATED
    figures = {TTFT: measured.ttft_s, TPOT: measured.tpot_s, E2E: measured.e2e_s}
    violated = tuple(
        name for name, bound in bounds.by_name().items()
        if (value := figures[name]) is not None and value > bound
    )
    return Verdict(True, violated)

