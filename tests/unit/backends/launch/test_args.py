"""backends.launch.args: secrets by reference in each syntax, flags and values of engine_args."""

from __future__ import annotations

import pytest

from backends.launch.args import (
    EnvRef,
    LaunchError,
    env_refs,
    flag_name,
    flag_values,
    resolve,
    shell_join,
    substitute,
)

ARGV = ["python", "-m", "srv", "--api-key", EnvRef("KEY"), "--name", "a b", EnvRef("KEY")]


def test_a_local_process_gets_the_value() -> None:
    assert resolve(ARGV, {"KEY": "sk"})[3:5] == ["--api-key", "sk"]
    with pytest.raises(LaunchError, match="not set: KEY"):
        resolve(ARGV, {})


def test_a_shell_line_expands_the_variable_itself() -> None:
    assert shell_join(ARGV) == "python -m srv --api-key \"$KEY\" --name 'a b' \"$KEY\""


def test_compose_and_kubernetes_syntax() -> None:
    assert substitute(ARGV, "${{{name}}}")[4] == "${KEY}"
    assert substitute(ARGV, "$({name})")[4] == "$(KEY)"
    assert env_refs(ARGV) == ["KEY"]


@pytest.mark.parametrize(("arg", "name"), [("--x", "--x"), ("--x=1", "--x"), ("-tp", "-tp"),
                                           ("-1", None), ("value", None), ("-", None)])
def test_flag_name(arg: str, name: str | None) -> None:
    assert flag_name(arg) == name


def test_flag_values_in_both_forms() -> None:
    args = ["--tp", "2", "--x", "--tp=4", "--tp"]
    assert flag_values(args, {"--tp"}) == ["2", "4"]
