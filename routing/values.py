"""``@value``: the per-request value types of the hot path — frozen for the type checker, plain
slotted dataclasses at run time.

Why: a frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` (its own
``__setattr__`` refuses), several times the cost of a plain slotted one, and a request builds
about fifteen such values on its way through the router. The type checker treats a ``@value``
class exactly as ``@dataclass(frozen=True, slots=True)`` (``typing.dataclass_transform`` with
``frozen_default``, which mypy honours), so assigning to a field is a type error under ``mypy
--strict``; equality and hashing are the frozen dataclass's (``unsafe_hash``). What goes: the
run-time refusal of an assignment, which no code of ridge's attempts. Long-lived configuration
and snapshots keep ``@dataclass(frozen=True)``.

See docs/routing.md#value-types-on-the-hot-path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True)
def value(cls: type[T]) -> type[T]:
    """``cls`` as a slotted dataclass with the frozen dataclass's equality and hash."""
    return dataclass(slots=True, unsafe_hash=True)(cls)
