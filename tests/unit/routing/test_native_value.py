"""NativeValue: a frozen dataclass's equality, hash, repr and pickling, from FIELDS."""

from __future__ import annotations

import importlib
import inspect
import pickle

import pytest

import gateway.native
import routing.formulas
from routing.formulas import RequestTokens, Verdict
from routing.native_value import NativeValue

COMPILED = not (routing.formulas.__file__ or "").endswith(".py")


def test_values_equal_field_by_field_and_hash_alike() -> None:
    a, b = RequestTokens(100, 20, 7), RequestTokens(100, 20, 7)
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    assert a != RequestTokens(100, 20, 8)
    assert a != (100, 20, 7)  # another type is never equal, as a dataclass's


def test_two_value_types_with_the_same_fields_are_not_equal() -> None:
    assert Verdict(True, ()) != RequestTokens(1, 0, 0)
    assert Verdict(True) == Verdict(True, ())  # defaults as the signature gives them


def test_repr_names_each_field_in_order() -> None:
    assert repr(RequestTokens(5, 0, 1)) == "RequestTokens(prompt=5, cached=0, completion=1)"


def test_a_value_pickles_to_an_equal_one() -> None:
    tokens = RequestTokens(9, 3, 2)
    assert pickle.loads(pickle.dumps(tokens)) == tokens


def test_replaced_is_a_copy_with_the_named_fields_set_anew() -> None:
    tokens = RequestTokens(9, 3, 2)
    assert tokens.replaced(cached=5) == RequestTokens(9, 5, 2)
    assert tokens == RequestTokens(9, 3, 2) and tokens.replaced() == tokens
    with pytest.raises(TypeError):
        tokens.replaced(prompts=1)


def _value_types() -> list[type[NativeValue]]:
    for name in gateway.native.COMPILED:
        importlib.import_module(name)
    return NativeValue.__subclasses__()


def test_every_value_type_names_its_fields_in_its_constructors_order() -> None:
    kinds = _value_types()
    assert len(kinds) >= 10, kinds  # the compiled modules' value types, all imported
    for kind in kinds:
        assert kind.FIELDS, kind
        if not COMPILED:  # a compiled class keeps no __slots__
            assert set(kind.FIELDS) <= set(kind.__slots__), kind
        try:
            params = tuple(inspect.signature(kind).parameters)
        except ValueError:  # a compiled signature with a default it cannot spell
            continue
        if params:  # the same caveat, on some builds
            assert params[:len(kind.FIELDS)] == kind.FIELDS, kind


@pytest.mark.skipif(not COMPILED, reason="the sources: Final is the type checker's alone")
def test_a_compiled_value_refuses_an_assignment() -> None:
    tokens = RequestTokens(9, 3, 2)
    with pytest.raises(AttributeError):
        tokens.prompt = 10  # type: ignore[misc]  # what the type checker refuses too
