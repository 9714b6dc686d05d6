"""The fleet file's ``slos:`` section: service-level objectives per model.

``slos`` maps a model name (or :data:`ANY_MODEL`, every other model) to its bounds ``ttft_s`` /
``tpot_s`` / ``e2e_s`` [s] and optional request classes (:class:`ModelSloSettings`,
:class:`SloClassSettings`), chosen by the client's ``x-ridge-slo-class`` header or by
``max_tokens`` band; a request no class covers is in :data:`DEFAULT_CLASS`. Class names are
unique per model; the model names are checked against the pools' (:mod:`config.fleet`). The
rules these settings become are in :mod:`gateway.telemetry.slos`. See docs/fleet-file.md.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from config.strict import PositiveFloat, Strict

ANY_MODEL = "*"
"""The ``slos`` key of every model without an entry of its own."""
DEFAULT_CLASS = "default"
"""The SLO class of a request no class covers (so no class may take this name)."""


class SloBoundsSettings(Strict):
    """Upper bounds [s] of one SLO: time to first token, per output token, end to end."""

    ttft_s: PositiveFloat | None = None
    tpot_s: PositiveFloat | None = None
    e2e_s: PositiveFloat | None = None


class SloClassSettings(SloBoundsSettings):
    """A request class of a model's SLO. ``min_max_tokens``: the class covers requests asking
    for at least that many output tokens (the highest band that fits wins); None = only when
    the client names the class in ``x-ridge-slo-class``. Unset bounds come from the model."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=32)]
    min_max_tokens: int | None = Field(default=None, ge=0)


class ModelSloSettings(SloBoundsSettings):
    """One model's SLO: its bounds and optional request classes."""

    classes: list[SloClassSettings] = Field(default_factory=list)

    @field_validator("classes")
    @classmethod
    def _distinct_classes(cls, value: list[SloClassSettings]) -> list[SloClassSettings]:
        names = [c.name for c in value]
        if len(set(names)) != len(names) or DEFAULT_CLASS in names:
            raise ValueError(f"class names must be unique and not {DEFAULT_CLASS!r}: {names}")
        return value
