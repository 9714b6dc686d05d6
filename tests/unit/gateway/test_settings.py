from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.settings import Settings


def test_env_prefix_and_nesting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIDGE_PORT", "9001")
    monkeypatch.setenv("RIDGE_UPSTREAM__TRANSPORT", "httpx")
    monkeypatch.setenv("RIDGE_REGISTRY__POLL_INTERVAL_S", "0.5")
    s = Settings()
    assert (s.port, s.upstream.transport, s.registry.poll_interval_s) == (9001, "httpx", 0.5)


def test_bad_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIDGE_UPSTREAM__TRANSPORT", "carrier-pigeon")
    with pytest.raises(ValidationError, match="transport"):
        Settings()
