"""A pool's ``model:``, ``hardware:`` and ``simulator:``: the facts its arithmetic needs.

:class:`ModelFacts` is the served model's shape (counts; ``dtype_bytes`` per element),
:class:`HardwareFacts` one accelerator's peak rates [FLOP/s, B/s] and host link [B/s],
:class:`SimulatorKnobs` what only the simulator reads. ``model:`` and ``hardware:`` take a
catalogue name (:mod:`config.builtin_facts`), a ``{name, overrides}`` mapping, or full facts;
:func:`model_input` and :func:`hardware_input` complete the first two from the catalogue at
load, so past the schema a pool's facts are :class:`ModelFacts` / :class:`HardwareFacts` or
None. A model named from the catalogue counts only its ``name`` and the fields the file writes
as set (``model_fields_set``), so a dump of the set fields names it again.
:meth:`ModelFacts.to_shape` and :meth:`HardwareFacts.to_rates` give the fleet arithmetic's
dataclasses (:mod:`routing.formulas`). See docs/fleet-file.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import Field

from config.builtin_facts import (
    UnknownName,
    accelerator_name,
    find_accelerator,
    find_model,
    model_name,
)
from config.strict import PositiveFloat, PositiveInt, Strict
from routing.formulas import HardwareRates, ModelShape


class ModelFacts(Strict):
    """The served model's shape. Units: counts, and bytes per element for ``dtype_bytes``."""

    name: str | None = Field(default=None, description="a label; the catalogue's name when the "
                             "facts come from config.builtin_facts")
    params: PositiveFloat = Field(description="parameter count N")
    layers: PositiveInt
    hidden_size: PositiveInt
    kv_heads: PositiveInt
    head_dim: PositiveInt
    dtype_bytes: PositiveFloat = Field(description="bytes per weight / KV element (fp16 = 2)")
    max_context: PositiveInt = 4096

    def to_shape(self, kv_dtype_bytes: float | None = None) -> ModelShape:
        """The shape the fleet arithmetic takes; ``kv_dtype_bytes`` None = ``dtype_bytes``."""
        return ModelShape(self.params, self.layers, self.hidden_size, self.kv_heads,
                          self.head_dim, self.dtype_bytes, kv_dtype_bytes)


class HardwareFacts(Strict):
    """One accelerator's peak rates. Units: FLOP/s and bytes/s."""

    name: str = "unknown"
    peak_flops: PositiveFloat = Field(description="peak dense FLOP/s")
    mem_bandwidth: PositiveFloat = Field(description="memory bandwidth in bytes/s")
    kv_cache_bytes: PositiveFloat | None = Field(
        default=None, description="bytes of KV cache per engine; None = engine default"
    )
    host_link_bandwidth: PositiveFloat = Field(
        default=25e9, description="bytes/s between host memory and the accelerator, for a "
        "host KV tier's reloads; default PCIe Gen4 x16's ~25 GB/s effective (32 GB/s raw)"
    )

    def to_rates(self) -> HardwareRates:
        """The peak rates the fleet arithmetic takes."""
        return HardwareRates(self.peak_flops, self.mem_bandwidth)


class SimulatorKnobs(Strict):
    """Settings only the simulator reads: how this pool behaves when simulated."""

    step_overhead_s: float = Field(default=0.0, ge=0)
    acceptance_rate: float = Field(
        default=0.7, ge=0, lt=1,
        description="draft-model speculation (eagle, medusa, mtp, draft_model): the chance each "
        "draft is accepted once those before it were; n-gram acceptance comes from the text",
    )
    acceptance_by_position: list[Annotated[float, Field(ge=0, lt=1)]] | None = Field(
        default=None, min_length=1,
        description="draft-model speculation: that chance per draft position (the last value "
        "repeats); replaces acceptance_rate",
    )
    copy_slip: float = Field(
        default=0.0, ge=0, lt=1,
        description="the chance a copied token of a 'repeat this' answer is a fresh word "
        "instead (a model's imperfect copy; see backends.sim.answers)",
    )
    repeat_share: float = Field(
        default=0.0, ge=0, lt=1,
        description="the share of free-text answer tokens that repeat earlier text of the "
        "sequence (prompt or answer), as models repeat themselves; see backends.sim.answers",
    )
    repeat_run_tokens: float = Field(
        default=6.0, ge=1, description="the mean length of such a repeat [tokens]"
    )
    repeat_after_tokens: int = Field(
        default=0, ge=0, description="answer tokens before the model starts repeating itself"
    )
    draft_cost: float | None = Field(
        default=None, ge=0,
        description="drafting time per draft token, as a fraction of a decode step; None = 0 "
        "for n-gram (a look-up in the sequence, no model to run), 0.05 for the other methods",
    )
    kv_link_bandwidth: PositiveFloat = 50e9
    seed: int = 0
    profile: str | None = Field(
        default=None,
        description="a hardware profile of backends.sim.profiles (calibrated overheads, memory); "
        "None = the one hardware.name names; a name that is no profile stops the simulator "
        "('generic-gpu': generic GPU overheads, asked for)",
    )
    mean_output_tokens: PositiveFloat | None = Field(
        default=None,
        description="mean of a sampled natural stop length (finish_reason stop); None = always "
        "generate max_tokens",
    )


_MODEL_FIELDS = frozenset({"params", "layers", "hidden_size", "kv_heads", "head_dim",
                           "dtype_bytes"})
_RATES = frozenset({"peak_flops", "mem_bandwidth"})


def model_input(value: Any) -> tuple[Any, set[str] | None]:
    """``model:`` as ModelFacts validates it, and the keys the file set when it named a
    catalogue model (None when it did not): a name alone, or a mapping with a ``name`` that
    lacks some of the shape's fields, takes the rest from the catalogue."""
    if isinstance(value, str):
        value = {"name": value}
    if isinstance(value, dict) and "name" in value and not value.keys() >= _MODEL_FIELDS:
        name = _catalogue_name(model_name, value["name"], "the full facts")
        given = {k: v for k, v in value.items() if k != "name"}
        return {**find_model(name).facts(), **given, "name": name}, {"name", *given}
    return value, None


def hardware_input(value: Any) -> Any:
    """``hardware:`` as HardwareFacts validates it: a name alone, or a mapping with a ``name``
    and without both rates, takes the rest from the catalogue."""
    if isinstance(value, str):
        value = {"name": value}
    if isinstance(value, dict) and "name" in value and not value.keys() >= _RATES:
        name = _catalogue_name(accelerator_name, value["name"],
                               "both peak_flops and mem_bandwidth")
        return {**find_accelerator(name).facts(), **value, "name": name}
    return value


def _catalogue_name(lookup: Callable[[str], str], name: Any, instead: str) -> str:
    try:
        return lookup(str(name))
    except UnknownName as exc:
        raise ValueError(f"{exc}; or give {instead}") from None
