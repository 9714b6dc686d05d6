"""backends.registry.resolver: a name's addresses as endpoint URLs, sorted; a failing look-up keeps
the last addresses and is logged once; a slow one is bounded. The look-up is a stub."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest

from backends.registry.resolver import DnsResolver, address_url, system_lookup, target_port
from config.fleet import parse_fleet
from config.pools import Pool


class StubLookup:
    """Answers from a table host → addresses (or an exception); records every call."""

    def __init__(self) -> None:
        self.answers: dict[str, Sequence[str] | Exception] = {}
        self.calls: list[tuple[str, int]] = []
        self.block = asyncio.Event()
        self.block.set()

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.calls.append((host, port))
        await self.block.wait()
        answer = self.answers.get(host, OSError("no such name"))
        if isinstance(answer, Exception):
            raise answer
        return answer


def dns_pool(*urls: str) -> Pool:
    raw = {"pools": [{"name": "p", "engine": "vllm", "models": ["m"], "endpoints": list(urls),
                      "resolve": "dns"}]}
    return parse_fleet(raw).pools[0]


@pytest.mark.parametrize(("url", "address", "expected"), [
    ("http://engine:8000", "10.0.0.5", "http://10.0.0.5:8000"),
    ("http://engine:8000/", "10.0.0.5", "http://10.0.0.5:8000"),
    ("http://engine", "10.0.0.5", "http://10.0.0.5:80"),
    ("http://engine:8000/base/v1", "10.0.0.5", "http://10.0.0.5:8000/base/v1"),
    ("http://u:pw@engine:8000", "10.0.0.5", "http://u:pw@10.0.0.5:8000"),
    ("http://engine:8000", "fd00::7", "http://[fd00::7]:8000"),
])
def test_an_address_becomes_a_url_with_the_port_and_path(url: str, address: str,
                                                         expected: str) -> None:
    assert address_url(url, address) == expected


def test_the_port_defaults_to_the_schemes() -> None:
    assert (target_port("http://a"), target_port("https://a"), target_port("http://a:9")) == \
        (80, 443, 9)


async def test_every_address_is_an_endpoint_sorted_without_repeats() -> None:
    lookup = StubLookup()
    lookup.answers["engine"] = ["10.0.0.10", "10.0.0.9", "fd00::1", "10.0.0.10"]
    urls = await DnsResolver(lookup).urls("http://engine:8000")
    assert urls == ("http://10.0.0.9:8000", "http://10.0.0.10:8000", "http://[fd00::1]:8000")
    assert lookup.calls == [("engine", 8000)]


async def test_a_pools_names_are_all_looked_up_and_only_dns_pools_are() -> None:
    lookup = StubLookup()
    lookup.answers.update({"a": ["10.0.0.1"], "b": ["10.0.0.2", "10.0.0.1"]})
    fleet = parse_fleet({"pools": [
        {"name": "dns", "engine": "vllm", "models": ["m"], "resolve": "dns",
         "endpoints": ["http://a:8000", "http://b:8000"]},
        {"name": "fixed", "engine": "vllm", "models": ["m"], "endpoints": ["http://c:8000"]}]})
    found = await DnsResolver(lookup).resolve(fleet.pools)
    assert found == {"dns": ("http://10.0.0.1:8000", "http://10.0.0.2:8000")}
    assert sorted(h for h, _ in lookup.calls) == ["a", "b"]


async def test_a_failure_keeps_the_last_addresses_and_is_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    lookup = StubLookup()
    resolver = DnsResolver(lookup)
    pool = dns_pool("http://engine:8000")
    lookup.answers["engine"] = ["10.0.0.1", "10.0.0.2"]
    first = await resolver.pool_urls(pool)
    assert len(first) == 2
    caplog.set_level(logging.INFO, logger="backends.registry.resolver")
    lookup.answers["engine"] = OSError("Temporary failure in name resolution")
    for _ in range(3):
        assert await resolver.pool_urls(pool) == first
    lookup.answers["engine"] = []  # no address at all: a failure too
    assert await resolver.pool_urls(pool) == first
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "engine:8000 (pool p)" in warnings[0].getMessage()
    assert "keeping its 2 last known address(es)" in warnings[0].getMessage()
    lookup.answers["engine"] = ["10.0.0.3"]
    assert await resolver.pool_urls(pool) == ("http://10.0.0.3:8000",)
    assert await resolver.pool_urls(pool) == ("http://10.0.0.3:8000",)
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert infos == ["endpoint engine:8000 (pool p) resolves again: 1 address(es)"]


async def test_a_name_that_never_resolved_has_no_endpoint() -> None:
    assert await DnsResolver(StubLookup()).pool_urls(dns_pool("http://nowhere:8000")) == ()


async def test_a_look_up_that_hangs_is_a_failure_after_the_timeout() -> None:
    lookup = StubLookup()
    lookup.answers["engine"] = ["10.0.0.1"]
    resolver = DnsResolver(lookup, timeout_s=0.05)
    assert await resolver.urls("http://engine:8000") == ("http://10.0.0.1:8000",)
    lookup.block.clear()  # never answers again
    assert await asyncio.wait_for(resolver.urls("http://engine:8000"), 30) == \
        ("http://10.0.0.1:8000",)


async def test_names_no_pool_uses_are_forgotten() -> None:
    lookup = StubLookup()
    lookup.answers["engine"] = ["10.0.0.1"]
    resolver = DnsResolver(lookup)
    await resolver.resolve([dns_pool("http://engine:8000")])
    await resolver.resolve([dns_pool("http://other:8000")])  # engine no longer used
    lookup.answers["engine"] = OSError("gone")
    assert await resolver.urls("http://engine:8000") == ()  # its last addresses went too


async def test_the_system_lookup_resolves_localhost() -> None:
    addresses = await system_lookup("localhost", 80)
    assert addresses and {"127.0.0.1", "::1"} & set(addresses)


def test_the_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError):
        DnsResolver(StubLookup(), timeout_s=0)
