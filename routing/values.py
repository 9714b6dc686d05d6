"""``@value``: the per-request value types of the hot path — frozen for the type checker, plain
slotted dataclasses at run time.

Why: a frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` (its
own ``__setattr__`` refuses), about 0.1 µs per field on CPython 3.11 against 0.02 µs for a
plain slotted one (7 fields: 0.84 against 0.19 µs, ``timeit``). A request builds about fifteen
such values on its way through the router (features, the state's view and ask, the policy's
input and decision, the plan, the reservation, the outcome, the telemetry record): some 70
fields, 5–7 µs of the routing work per request (``ridge_bench.overhead.routing_cost``).

What stays: the type checker treats a ``@value`` class exactly as ``@dataclass(frozen=True,
slots=True)`` (``typing.dataclass_transform`` with ``frozen_default``, which mypy honours),
so assigning to a field is a type error under ``mypy --strict`` as before; equality and
hashing are the frozen dataclass's (``unsafe_hash``: a hash of the fields, as a frozen
dataclass derives it).
What goes: the run-time refusal of an assignment, which no code of ridge's attempts (mypy
checks it). Long-lived configuration and snapshots keep ``@dataclass(frozen=True)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True)
def value(cls: type[T]) -> type[T]:
    """``cls`` as a slotted dataclass with the frozen dataclass's equality and hash."""
    return dataclass(slots=True, unsafe_hash=True)(cls)
