from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.fakes.engine import FakeEngine


@pytest.fixture(params=["http1", "aiohttp"])
def transport(request: pytest.FixtureRequest) -> str:
    """Every upstream transport goes through the tests that depend on transport behaviour."""
    value: str = request.param
    return value


@pytest.fixture
async def engines() -> AsyncIterator[list[FakeEngine]]:
    """Two fake engines on free ports, stopped after the test."""
    fakes = [FakeEngine(), FakeEngine()]
    for f in fakes:
        await f.start()
    yield fakes
    for f in fakes:
        await f.stop()
