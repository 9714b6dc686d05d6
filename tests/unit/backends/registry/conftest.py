"""The registry tests' fixtures: a fake clock, a registry on it, and for the pools that change
a stub DNS look-up and a MetricsSource that finds every address up."""

from __future__ import annotations

import pytest

from backends.registry.endpoints import EndpointRegistry
from tests.unit.backends.registry.fakes import (
    B1,
    FakeClock,
    FakeSource,
    StubLookup,
    ip,
    lever_fleet,
    make_fleet,
    up,
)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def registry(clock: FakeClock) -> EndpointRegistry:
    """The pools of :func:`make_fleet`, metrics shown for 10 s."""
    return EndpointRegistry(make_fleet(), metrics_ttl_s=10.0, clock=clock)


@pytest.fixture
def checked(clock: FakeClock) -> EndpointRegistry:
    """The pools of :func:`lever_fleet`: their engines' facts are checked against levers."""
    return EndpointRegistry(lever_fleet(), clock=clock)


@pytest.fixture
def lookup() -> StubLookup:
    return StubLookup()


@pytest.fixture
def source() -> FakeSource:
    """A MetricsSource that finds ``ip(1)`` to ``ip(9)`` and B1 up."""
    fake = FakeSource()
    for url in [*(ip(n) for n in range(1, 10)), B1]:
        up(fake, url)
    return fake

