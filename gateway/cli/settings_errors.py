"""Bad settings, one line each: the flag or environment variable, its value, what is allowed.

:class:`gateway.settings.Settings` reads ``RIDGE_*`` variables (``__`` for nesting) and the
command line's flags. pydantic reports a bad value by its field's location (``upstream.transport``)
with ``Input should be ...``; an operator set ``RIDGE_UPSTREAM__TRANSPORT`` or ``--port``, so
:func:`load_settings` reports it under that name:

    RIDGE_PORT=abc: must be a valid integer, unable to parse string as an integer
    --port 99999: must be less than or equal to 65535
    RIDGE_UPSTREAM__TRANSPORT=h3: must be 'http1' or 'aiohttp'

A value given as JSON for a whole group (``RIDGE_UPSTREAM='{"transport": "h3"}'``) is named by
its variable and the field inside it; a variable that is not valid JSON where JSON is needed
(pydantic-settings' ``SettingsError``) gets one line too. The log level, a plain string field,
is checked against the levels uvicorn accepts. A ``RIDGE_*`` variable that is no setting (and
none of :data:`OTHER_VARIABLES`) is a warning naming the closest one (:func:`unknown_variables`):
a misspelt setting would otherwise be silently ignored.
"""

from __future__ import annotations

import difflib
import json
import re
import shlex
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails
from pydantic_settings import SettingsError
from uvicorn.config import LOG_LEVELS  # undocumented: see test_settings_errors_pins.py

from gateway.settings import Settings

PREFIX = str(Settings.model_config.get("env_prefix") or "")
NESTING = str(Settings.model_config.get("env_nested_delimiter") or "__")
OTHER_VARIABLES = frozenset({
    "RIDGE_ENGINES_DIR", "RIDGE_PURE_PYTHON", "RIDGE_COMPILE", "RIDGE_BENCH_UPSTREAMS",
    "RIDGE_PROMETHEUS_URL", "RIDGE_DASHBOARDS"})
"""``RIDGE_*`` variables that are not settings, read elsewhere: where the real engines are
installed, the build and test switches of the compiled routing modules, the benchmark's
upstreams, and the variables of the rendered Grafana's provisioning."""


def variable_names(model: type[BaseModel] = Settings, prefix: str = PREFIX) -> Iterator[str]:
    """Every variable ``model`` reads: a field's name upper-cased after ``prefix``; a group's
    own name (JSON for the whole group) and its fields' after ``NAME__``."""
    for field, info in model.model_fields.items():
        name = f"{prefix}{field.upper()}"
        yield name
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            yield from variable_names(kind, name + NESTING)


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A warning per ``RIDGE_*`` variable of ``environ`` that ridge does not read, naming the
    closest one it does."""
    known = {*variable_names(), *OTHER_VARIABLES}
    lines = []
    for name in sorted(n for n in environ if n.upper().startswith(PREFIX)):
        if name.upper() in known:
            continue
        close = difflib.get_close_matches(name.upper(), known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else " (docs/settings.md lists them)"
        lines.append(f"{name} is not a setting, so it is ignored{hint}")
    return lines


class BadSettings(Exception):
    """Settings that cannot be used; ``lines``: one message per bad setting."""

    def __init__(self, lines: Sequence[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = list(lines)


def load_settings(flags: Mapping[str, Any], flag_names: Mapping[str, str],
                  environ: Mapping[str, str]) -> Settings:
    """:class:`Settings` from the environment with ``flags`` (field → value) on top, or
    :class:`BadSettings`; ``flag_names``: field → the flag that set it (``--port``)."""
    given = {field: flag_names[field] for field in flags}
    try:
        settings = Settings(**flags)
    except ValidationError as exc:
        raise BadSettings(describe(exc, given, environ)) from None
    except SettingsError as exc:
        raise BadSettings([describe_source_error(exc, environ)]) from None
    problem = log_level_problem(settings.log_level, environ)
    if problem:
        raise BadSettings([problem])
    return settings


def describe(exc: ValidationError, flags: Mapping[str, str],
             environ: Mapping[str, str]) -> list[str]:
    """One line per error of ``exc``; ``flags``: field → the flag that gave it."""
    return [_line(err, flags, environ) for err in exc.errors(include_url=False)]


def _line(err: ErrorDetails, flags: Mapping[str, str], environ: Mapping[str, str]) -> str:
    loc = [str(part) for part in err["loc"]]
    value = err.get("input")
    if loc and loc[0] in flags:
        where = f"{flags[loc[0]]} {_shown(value)}"
    else:
        where = _env_source(loc, value, environ)
    return f"{where}: {allowed(err['msg'])}"


def _env_source(loc: Sequence[str], value: Any, environ: Mapping[str, str]) -> str:
    """``NAME=value`` for the variable that set the field at ``loc``; when that variable holds
    a JSON group, ``NAME (field.path=value)``."""
    for depth in range(len(loc), 0, -1):
        name = env_name(loc[:depth], environ)
        if name is None:
            continue
        if depth == len(loc):
            return f"{name}={_shown(value)}"
        return f"{name} ({'.'.join(loc)}={_shown(value)})"
    return f"{_variable(loc)}={_shown(value)}"


def env_name(loc: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """The environment variable (as spelled there) for the field at ``loc``, if it is set;
    names are matched without regard to case, as pydantic-settings reads them."""
    wanted = _variable(loc).lower()
    found = [key for key in environ if key.lower() == wanted]
    return min(found) if found else None


def _variable(loc: Sequence[str]) -> str:
    return PREFIX + NESTING.join(part.upper() for part in loc)


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return shlex.quote(value)
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def allowed(message: str) -> str:
    """pydantic's message as a rule: ``Input should be X`` → ``must be X``."""
    message = re.sub(r"^Value error, ", "", message)
    return re.sub(r"^Input should ", "must ", message)


def describe_source_error(exc: SettingsError, environ: Mapping[str, str]) -> str:
    """A variable pydantic-settings could not decode (not valid JSON for a list or a group)."""
    match = re.search(r'field "([^"]+)"', str(exc))
    if match is None:
        return str(exc)
    field = match.group(1)
    name = env_name([field], environ) or _variable([field])
    value = environ.get(name, "")
    return f"{name}={_shown(value)}: {_json_needed(field)}"


def _json_needed(field: str) -> str:
    info = Settings.model_fields.get(field)
    annotation = info.annotation if info is not None else None
    if get_origin(annotation) is list:
        return 'must be a JSON list, e.g. ["a", "b"]'
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return (f"must be a JSON object, e.g. {{\"{next(iter(annotation.model_fields))}\": "
                f"...}}, or set its fields one by one ({_variable([field])}{NESTING}NAME)")
    return "must be valid JSON"


def log_level_problem(level: str, environ: Mapping[str, str]) -> str | None:
    """Why ``level`` is not a log level uvicorn accepts (``uvicorn.config.LOG_LEVELS``), or
    None."""
    if level.lower() in LOG_LEVELS:
        return None
    name = env_name(["log_level"], environ) or _variable(["log_level"])
    return f"{name}={_shown(level)}: must be one of {', '.join(LOG_LEVELS)}"
