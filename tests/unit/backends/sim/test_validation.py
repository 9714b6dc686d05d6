"""Bodies checked as vLLM 0.32's pydantic models check them, and its rendering of the errors
(the whole path against the real server's answers: ``test_openai_api.py``)."""

from __future__ import annotations

import pytest

from backends.sim.validation import (
    MESSAGE_UNION,
    UNREADABLE,
    BodyInvalid,
    BodyUnreadable,
    clean_loc,
    format_error,
    parse_json,
    render_errors,
    sanitize,
    summarise_input,
    validate_body,
)


def _errors(kind: str, body: object) -> list[dict[str, object]]:
    with pytest.raises(BodyInvalid) as caught:
        validate_body(kind, body)  # type: ignore[arg-type]
    return caught.value.errors


def test_fields_are_coerced_in_lax_mode_and_defaults_filled_in() -> None:
    values = validate_body("chat", {"messages": [], "max_tokens": "7", "stream": "on",
                                    "ignore_eos": 0, "seed": 3.0, "temperature": 0.2})
    assert (values["max_tokens"], values["stream"], values["ignore_eos"], values["seed"]) == (
        7, True, False, 3)
    assert values["n"] == 1 and values["min_tokens"] == 0 and "temperature" not in values
    assert validate_body("completion", {"prompt": "a"})["max_tokens"] == 16  # vLLM's default


def test_errors_come_in_field_order_with_body_prefixed_locations() -> None:
    errors = _errors("chat", {"messages": "hi", "seed": 2**63, "stream": [1]})
    assert [(e["type"], clean_loc(e["loc"])) for e in errors] == [  # type: ignore[arg-type]
        ("list_type", "body.messages"), ("less_than_equal", "body.seed"),
        ("bool_type", "body.stream")]
    assert _errors("completion", [1])[0]["loc"] == ("body",)  # a body that is no object


def test_a_message_that_is_no_object_fails_every_branch_of_the_union() -> None:
    errors = _errors("chat", {"messages": [{"role": "user", "content": "a"}, "b"],
                              "max_tokens": "x"})
    branches = [e["loc"] for e in errors[:len(MESSAGE_UNION)]]
    assert branches == [("body", "messages", 1, name) for name, _, _ in MESSAGE_UNION]
    assert clean_loc(errors[-1]["loc"]) == "body.max_tokens"  # type: ignore[arg-type]


def test_locations_lose_pydantics_internal_segments() -> None:
    assert clean_loc(("body", "prompt", "list[constrained-int]", 1)) == "body.prompt.1"
    assert clean_loc(("body", "prompt", "str")) == "body.prompt"
    assert clean_loc(("body", "x", "function-wrap[f()]", "y")) == "body.x.y"
    assert clean_loc(("str",)) == "str"  # nothing left: the whole location


def test_offending_values_are_bounded() -> None:
    assert summarise_input("a" * 201) == "a" * 200 + "...[truncated]"
    assert summarise_input("a" * 200) == "a" * 200
    assert summarise_input([1, 2, 3]) == "<list of 3 items>"
    assert summarise_input({"a": 1}) == "<dict of 1 items>"
    assert summarise_input(b"xy") == "<bytes of 2 bytes>"
    assert summarise_input(None) == "None" and summarise_input(1.5) == "1.5"
    line = format_error({"type": "t", "loc": ("body", "x"), "msg": "m" * 2000, "input": 1})
    assert len(line) == 1000 + len("...[truncated]") and line.endswith("...[truncated]")


def test_at_most_ten_errors_are_listed() -> None:
    errors = [{"type": "missing", "loc": ("body", f"f{i}"), "msg": "Field required",
               "input": None} for i in range(12)]
    message, param = render_errors(errors)
    lines = message.split("\n")
    assert lines[0] == "12 validation errors:" and len(lines) == 12
    assert lines[1] == "  {'type': 'missing', 'loc': 'body.f0', 'msg': 'Field required', " \
                       "'input': 'None'}"
    assert lines[-1] == "  ...and 2 more errors" and param == "body.f0"
    assert render_errors(errors[:1])[0].startswith("1 validation error:\n")


def test_messages_are_sanitized_as_vllm_does() -> None:
    assert sanitize("see /home/user/secret.txt now ") == "see <path> now"
    assert sanitize("<object at 0x7f00ab>") == "<object>"
    message, _ = render_errors([{"type": "string_type", "loc": ("body", "model"),
                                 "msg": "Input should be a valid string",
                                 "input": "/usr/lib/x"}])
    assert "'input': '<path>'" in message


@pytest.mark.parametrize(("raw", "kind", "loc"), [
    (b"", "missing", ("body",)), (b"  ", "json_invalid", ("body", 2)),
    (b"null", "missing", ("body",)),
    (b'{"a": }', "json_invalid", ("body", 6)),
])
def test_bodies_that_are_not_json_documents(raw: bytes, kind: str, loc: tuple[object, ...]) -> None:
    with pytest.raises(BodyInvalid) as caught:
        parse_json(raw)
    (error,) = caught.value.errors
    assert (error["type"], error["loc"]) == (kind, loc)
    with pytest.raises(BodyUnreadable, match=UNREADABLE):
        parse_json(b'{"a": "\xff"}')
    assert parse_json(b'[1]') == [1]
