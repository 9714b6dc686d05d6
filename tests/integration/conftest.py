from __future__ import annotations

import pytest


@pytest.fixture(params=["aiohttp", "httpx"])
def transport(request: pytest.FixtureRequest) -> str:
    """Both upstream transports go through the tests that depend on transport behaviour."""
    value: str = request.param
    return value
