"""The suite's start: which of the compiled modules it runs (``gateway.native``).

``RIDGE_PURE_PYTHON=1``: their sources, even where compiled modules exist (``make test`` runs
their units a second time so). Otherwise compiled modules older than their sources
stop the run before anything is imported: they would test the old code.
"""

from __future__ import annotations

import os

import pytest

from gateway import native


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("RIDGE_PURE_PYTHON"):
        native.prefer_sources()
    elif old := native.stale():
        pytest.exit(native.stale_message(old), returncode=2)
