"""Which SLO applies to a request: the fleet file's ``slos`` as a policy of bounds per request.

The bounds and the verdict on a finished request are arithmetic, in :mod:`routing.formulas`;
this module only chooses the bounds (:meth:`SloPolicy.bounds_for`): the model's entry, else
``*``, else none; inside it the class the client names (:data:`SLO_CLASS_HEADER`) when the
entry defines it, else the ``min_max_tokens`` band of the request's ``max_tokens``, else the
entry's own bounds; a class's unset bounds inherited from its entry.

A class the model does not define is not an error: the request is served and judged as if it
had named none (telemetry counts it, :class:`gateway.telemetry.prometheus.UnknownClasses`).
:func:`slo_policy` converts the fleet's validated settings. Bounds are seconds; pure, no I/O and
no clock. See docs/telemetry.md#slo-classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from config.fleet import Fleet
from config.slos import ANY_MODEL, DEFAULT_CLASS, SloBoundsSettings
from routing.formulas import Bounds

SLO_CLASS_HEADER = "x-ridge-slo-class"
"""The request header by which a client names its SLO class."""
_UNBOUNDED = (DEFAULT_CLASS, Bounds())
"""A request of a model without an SLO: the default class, no bound."""


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
        if not self.classes:
            return DEFAULT_CLASS, self.bounds
        chosen = next((c for c in self.classes if c.name == requested_class),
                      None) if requested_class else None
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
            return _UNBOUNDED
        return slo.resolve(max_tokens, requested_class)

    def classes_of(self, model: str) -> tuple[str, ...]:
        """The classes a client may name for ``model`` (its entry's, else ``*``'s)."""
        slo = self.models.get(model) or self.models.get(ANY_MODEL)
        return tuple(c.name for c in slo.classes) if slo is not None else ()

    def class_names(self) -> frozenset[str]:
        """Every class label value this policy can produce."""
        return frozenset({DEFAULT_CLASS}) | {
            c.name for slo in self.models.values() for c in slo.classes
        }


def _bounds(settings: SloBoundsSettings) -> Bounds:
    return Bounds(settings.ttft_s, settings.tpot_s, settings.e2e_s)


def slo_policy(fleet: Fleet) -> SloPolicy:
    """The fleet file's ``slos`` as a policy (no section: no SLO for any model)."""
    models = {
        model: ModelSlo(_bounds(slo), tuple(
            SloClass(c.name, _bounds(c), c.min_max_tokens) for c in slo.classes))
        for model, slo in fleet.slos.items()
    }
    return SloPolicy(MappingProxyType(models))
