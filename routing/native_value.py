"""``NativeValue``: the base of the per-request value types of the compiled modules
(:data:`gateway.native.COMPILED`), where ``@value`` (:mod:`routing.values`) serves those that
run as Python.

Why a class of its own: a dataclass's ``__init__`` is Python, compiled or not, so a value made
in compiled code costs a call into the interpreter and each field read a look-up by name.
mypyc compiles a plain class with its own ``__init__`` into a C struct: made and read from
compiled code with no Python call, and cheaper than a dataclass to make from Python too
(docs/benchmarks/overhead.md has the figures).

A subclass names its fields in order in ``FIELDS`` (and sets ``__slots__ = FIELDS``, for the
sources run uncompiled) and sets each as ``Final`` in an ``__init__`` taking them in that
order. Equality, hash, repr and pickling are a frozen dataclass's, from ``FIELDS``, and
:meth:`NativeValue.replaced` is :func:`dataclasses.replace`. ``Final``
makes assigning a field a type error under ``mypy --strict``, and, compiled, an
``AttributeError``. See docs/routing.md#value-types-on-the-hot-path.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

V = TypeVar("V", bound="NativeValue")


class NativeValue:
    """The base of a compiled module's value type (module docstring)."""

    __slots__ = ()
    FIELDS: ClassVar[tuple[str, ...]] = ()
    """The fields, in the order ``__init__`` takes them."""

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.FIELDS)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, NativeValue)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.FIELDS)
        return f"{type(self).__name__}({fields})"

    def __reduce__(self) -> tuple[type[NativeValue], tuple[Any, ...]]:
        return type(self), self._values()

    def replaced(self: V, **changes: Any) -> V:
        """A copy with the fields ``changes`` names set anew, as :func:`dataclasses.replace`
        (a name not in ``FIELDS`` is a TypeError)."""
        values = dict(zip(self.FIELDS, self._values(), strict=True))
        values.update(changes)
        return type(self)(**values)
