from __future__ import annotations

import pytest
from pydantic import ValidationError
from pydantic_settings import SettingsError

from gateway.cli.settings_errors import (
    BadSettings,
    allowed,
    describe,
    describe_source_error,
    env_name,
    load_settings,
    log_level_problem,
    unknown_variables,
    variable_names,
)
from gateway.settings import Settings

FLAGS = {"host": "--host", "port": "--port", "workers": "--workers"}


def _errors(env: dict[str, str], **flags: object) -> list[str]:
    with pytest.raises(BadSettings) as caught:
        load_settings(flags, FLAGS, env)
    return caught.value.lines


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in [n for n in os.environ if n.upper().startswith("RIDGE_")]:
        monkeypatch.delenv(name)


def test_good_settings_pass_with_flags_on_top(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIDGE_PORT", "9000")
    settings = load_settings({"host": "0.0.0.0"}, FLAGS, {"RIDGE_PORT": "9000"})
    assert (settings.host, settings.port) == ("0.0.0.0", 9000)


def test_a_flag_is_named_with_its_value() -> None:
    assert _errors({}, port=99999) == ["--port 99999: must be less than or equal to 65535"]


def test_a_variable_is_named_as_set(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"RIDGE_PORT": "abc", "ridge_upstream__transport": "h3"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert _errors(env) == [
        "RIDGE_PORT=abc: must be a valid integer, unable to parse string as an integer",
        "ridge_upstream__transport=h3: must be 'http1' or 'aiohttp'",
    ]


def test_a_field_inside_a_json_group_is_named_with_its_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"RIDGE_UPSTREAM": '{"retries": -1}'}
    monkeypatch.setenv("RIDGE_UPSTREAM", env["RIDGE_UPSTREAM"])
    assert _errors(env) == [
        "RIDGE_UPSTREAM (upstream.retries=-1): must be greater than or equal to 0"]


def test_values_are_quoted_as_a_shell_would_need() -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(port="x y")  # type: ignore[arg-type]
    assert describe(caught.value, {}, {"RIDGE_PORT": "x y"}) == [
        "RIDGE_PORT='x y': must be a valid integer, unable to parse string as an integer"]


def test_variables_that_are_not_json_where_json_is_needed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIDGE_CORS_ORIGINS", "https://a.example")
    assert _errors({"RIDGE_CORS_ORIGINS": "https://a.example"}) == [
        'RIDGE_CORS_ORIGINS=https://a.example: must be a JSON list, e.g. ["a", "b"]']
    exc = SettingsError('error parsing value for field "upstream" from source "EnvSettings"')
    assert describe_source_error(exc, {"RIDGE_UPSTREAM": "x"}) == (
        'RIDGE_UPSTREAM=x: must be a JSON object, e.g. {"transport": ...}, or set its fields '
        "one by one (RIDGE_UPSTREAM__NAME)")


def test_the_log_level_must_be_one_uvicorn_knows() -> None:
    assert log_level_problem("DEBUG", {}) is None
    assert log_level_problem("loud", {"RIDGE_LOG_LEVEL": "loud"}) == (
        "RIDGE_LOG_LEVEL=loud: must be one of critical, error, warning, info, debug, trace")


def test_env_names_match_without_regard_to_case() -> None:
    assert env_name(["upstream", "transport"], {"Ridge_Upstream__Transport": "x"}) == (
        "Ridge_Upstream__Transport")
    assert env_name(["port"], {}) is None


@pytest.mark.parametrize(("message", "rule"), [
    ("Input should be a valid integer", "must be a valid integer"),
    ("Input should have at least 1 item", "must have at least 1 item"),
    ("Value error, bad origin", "bad origin"),
    ("Field required", "Field required"),
])  # fmt: skip
def test_messages_read_as_rules(message: str, rule: str) -> None:
    assert allowed(message) == rule


def test_a_variable_that_is_no_setting_is_named_with_the_closest_one() -> None:
    environ = {"RIDGE_PROT": "9000", "RIDGE_HTTP__BODY_TIMEOT_S": "5", "RIDGE_PORT": "1",
               "RIDGE_UPSTREAM": "{}", "RIDGE_ENGINES_DIR": "/e", "RIDGE_QQQZZZ": "x",
               "PATH": "/bin", "ridge_port": "2"}
    assert unknown_variables(environ) == [
        "RIDGE_HTTP__BODY_TIMEOT_S is not a setting, so it is ignored; did you mean "
        "RIDGE_HTTP__BODY_TIMEOUT_S?",
        "RIDGE_PROT is not a setting, so it is ignored; did you mean RIDGE_PORT?",
        "RIDGE_QQQZZZ is not a setting, so it is ignored (docs/settings.md lists them)"]


def test_every_setting_and_group_is_a_known_variable() -> None:
    names = set(variable_names())
    assert {"RIDGE_PORT", "RIDGE_UPSTREAM", "RIDGE_UPSTREAM__CONNECT_TIMEOUT_S",
            "RIDGE_ADMISSION__ENABLED"} <= names
    assert unknown_variables({n: "" for n in names}) == []
