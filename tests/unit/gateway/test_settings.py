from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.settings import Settings


def test_env_prefix_and_nesting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIDGE_PORT", "9001")
    monkeypatch.setenv("RIDGE_UPSTREAM__TRANSPORT", "aiohttp")
    monkeypatch.setenv("RIDGE_REGISTRY__POLL_INTERVAL_S", "0.5")
    s = Settings()
    assert (s.port, s.upstream.transport, s.registry.poll_interval_s) == (9001, "aiohttp", 0.5)


def test_bad_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIDGE_UPSTREAM__TRANSPORT", "carrier-pigeon")
    with pytest.raises(ValidationError, match="transport"):
        Settings()


def test_admission_control_is_on_by_default_and_configured_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().admission.enabled and Settings().admission.max_wait_s == 10.0
    monkeypatch.setenv("RIDGE_ADMISSION__ENABLED", "false")
    monkeypatch.setenv("RIDGE_ADMISSION__MAX_QUEUE", "32")
    s = Settings()
    assert not s.admission.enabled and s.admission.max_queue == 32
    monkeypatch.setenv("RIDGE_ADMISSION__MAX_WAIT_S", "0")
    with pytest.raises(ValidationError, match="max_wait_s"):
        Settings()
