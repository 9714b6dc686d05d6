"""Pins of ``gateway/cli/settings_errors.py``: it checks ``RIDGE_LOG_LEVEL`` against
``uvicorn.config.LOG_LEVELS``, an undocumented module global (level name → logging level),
taking its keys as the levels ``uvicorn.Config(log_level=...)`` accepts. These tests fail,
naming uvicorn's versions and the hook, when an upgrade changed it."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import uvicorn
import uvicorn.config

from tests.unit.library_pins import Hook

WRITTEN_AGAINST = "0.54.0"
"""The uvicorn release log_level_problem was written against."""

HOOK = Hook("uvicorn", WRITTEN_AGAINST, "log_level_problem in gateway/cli/settings_errors.py")


def test_the_installed_uvicorn_is_the_minor_release_the_hook_was_checked_against() -> None:
    HOOK.check_version()
    HOOK.check_pin()


def check_levels(levels: object) -> None:
    HOOK.check(isinstance(levels, Mapping), "LOG_LEVELS is no longer a mapping")
    assert isinstance(levels, Mapping)
    HOOK.check(levels and all(isinstance(k, str) and k == k.lower() and isinstance(v, int)
                              for k, v in levels.items()),
               "LOG_LEVELS is no longer lowercase level names to logging levels")
    HOOK.check({"debug", "info", "warning", "error", "critical"} <= set(levels),
               "LOG_LEVELS lost a standard level")


def test_log_levels_are_the_levels_the_config_accepts() -> None:
    levels = HOOK.attribute(uvicorn.config, "LOG_LEVELS")
    check_levels(levels)
    for name in levels:
        config = uvicorn.Config(app=None, log_config=None, log_level=name.upper())  # type: ignore[arg-type]
        config.configure_logging()  # where the level is looked up (upper case is accepted)


def test_a_failure_names_the_library_both_versions_and_the_hook() -> None:
    """The checks can fail: levels as an upgrade could reshape them (names to names)."""
    with pytest.raises(pytest.fail.Exception) as failed:
        check_levels({"info": "INFO"})
    message = str(failed.value)
    for part in (f"uvicorn {HOOK.installed()} is installed", f"uvicorn {WRITTEN_AGAINST}",
                 "lowercase level names to logging levels", "gateway/cli/settings_errors.py"):
        assert part in message
