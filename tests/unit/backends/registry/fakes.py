"""Fakes for the registry's tests: endpoint URLs and metrics, fleets, a clock, a MetricsSource
that answers from tables, and a DNS look-up that answers what it is told."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from backends.engines.dialects import EngineDialect
from backends.engines.facts import Facts
from backends.engines.probe import ProbeError
from backends.registry.endpoints import EndpointRegistry
from backends.registry.poller import Poller
from backends.registry.resolver import DnsResolver
from config.engines import Engine
from config.fleet import Fleet, parse_fleet
from routing.snapshots import EngineMetrics

A1, A2 = "http://a1:8000", "http://a2:8000"
B1 = "http://b1:8000"
C1 = "http://c1:8000"
M1 = EngineMetrics(running=1.0, waiting=2.0, kv_block_size=16)
M2 = EngineMetrics(running=5.0)
SCRAPE_FAILED = ProbeError(A1, "HTTP 500")


def pool(
    name: str, engine: str, models: list[str], urls: list[str], **extra: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "engine": engine,
        "models": models,
        "endpoints": urls,
        "model": {
            "params": 1e8,
            "layers": 2,
            "hidden_size": 64,
            "kv_heads": 1,
            "head_dim": 64,
            "dtype_bytes": 2,
        },
        "hardware": {"peak_flops": 1e12, "mem_bandwidth": 1e11},
        **extra,
    }


def make_fleet() -> Fleet:
    return parse_fleet(
        {
            "pools": [
                pool("a", "vllm", ["m1", "m2"], [A1, A2 + "/"]),
                pool("b", "sglang", ["m2", "m3"], [B1]),
                pool("c", "vllm", ["m4"], [C1]),
            ]
        }
    )


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


Behaviour = bool | EngineMetrics | Exception | Callable[[], Any]


class FakeSource:
    """Answers from per-URL tables; an unknown URL is refused (its facts: none known).
    Records every call."""

    def __init__(self) -> None:
        self.health_of: dict[str, Behaviour] = {}
        self.metrics_of: dict[str, Behaviour] = {}
        self.facts_of: dict[str, Facts | Exception] = {}
        self.calls: list[tuple[str, str, Engine]] = []

    async def health(self, url: str, dialect: EngineDialect) -> bool:
        self.calls.append(("health", url, dialect.engine))
        result = await self._answer(self.health_of, url)
        assert isinstance(result, bool)
        return result

    async def metrics(self, url: str, dialect: EngineDialect) -> EngineMetrics:
        self.calls.append(("metrics", url, dialect.engine))
        result = await self._answer(self.metrics_of, url)
        assert isinstance(result, EngineMetrics)
        return result

    async def facts(self, url: str, dialect: EngineDialect) -> Facts:
        self.calls.append(("facts", url, dialect.engine))
        answer = self.facts_of.get(url, {})
        if isinstance(answer, Exception):
            raise answer
        return answer

    @staticmethod
    async def _answer(table: dict[str, Behaviour], url: str) -> Any:
        answer = table.get(url, ProbeError(url, "connection refused"))
        if callable(answer):
            answer = await answer()
        if isinstance(answer, Exception):
            raise answer
        return answer


def up(source: FakeSource, url: str, metrics: Behaviour = M1) -> None:
    source.health_of[url] = True
    source.metrics_of[url] = metrics


def down(source: FakeSource, url: str) -> None:
    source.health_of.pop(url, None)
    source.metrics_of.pop(url, None)


def facts_reads(source: FakeSource, url: str) -> int:
    return sum(1 for what, u, _ in source.calls if what == "facts" and u == url)


SPEC_ON = {"prefix_cache": True, "chunked_prefill": False, "speculative": True, "draft_tokens": 4}
SPEC_OFF = {"prefix_cache": True, "chunked_prefill": False, "speculative": False}


def lever_fleet() -> Fleet:
    """Pool a (A1, A2) declares prefix caching and n-gram speculation (K = 4)."""
    levers = {"prefix_caching": True, "speculative": {"method": "ngram", "num_draft_tokens": 4}}
    return parse_fleet({"pools": [pool("a", "vllm", ["m1"], [A1, A2], levers=levers),
                                  pool("b", "sglang", ["m2"], [B1])]})


# -- endpoints that change -------------------------------------------------------------------------

NAME = "http://engine-a.ns.svc:8000"


def ip(n: int) -> str:
    return f"http://10.0.0.{n}:8000"


class StubLookup:
    """The look-up of every name: a list of addresses, or an exception."""

    def __init__(self) -> None:
        self.answer: Sequence[str] | Exception = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        await self.gate.wait()
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def addresses(self, *last_octets: int) -> None:
        self.answer = [f"10.0.0.{n}" for n in last_octets]


def dns_fleet(**extra: Any) -> Fleet:
    return parse_fleet({"pools": [pool("a", "vllm", ["m"], [NAME], resolve="dns", **extra),
                                  pool("b", "vllm", ["m"], [B1])]})


def urls_of(registry: EndpointRegistry, pool_name: str) -> list[str]:
    return [e.url for p in registry.snapshot() if p.name == pool_name for e in p.endpoints]


def poller_of(registry: EndpointRegistry, source: FakeSource, lookup: StubLookup,
              in_flight: Any = None) -> Poller:
    return Poller(registry, source, resolver=DnsResolver(lookup), in_flight=in_flight)

