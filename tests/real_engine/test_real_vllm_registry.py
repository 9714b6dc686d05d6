"""ridge's scrape of a real vLLM ``/metrics`` page equals the engine's own figures.

The reference reading uses ``prometheus_client``'s parser and the metric names listed here
(from vLLM 0.32's metrics page and docs), not ridge's dialect table or parser, so a wrong
name, a wrong label or a parser slip in ridge shows up as a mismatch. Both engines are idle
while read (each is read again after the probe to make sure nothing moved in between).

The registry's lever check is held against the same engines: what they say they run (their
``vllm:cache_config_info``, speculative counters and model list) matches the fleet file.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from openai import OpenAI
from prometheus_client import CollectorRegistry

from backends.engines.dialects import dialect_for
from backends.engines.probe import HttpProbe
from backends.registry.endpoints import EndpointRegistry
from backends.registry.poller import Poller
from gateway.app import build_router
from gateway.telemetry.fleet_gauges import CircuitGauges
from routing.features import FeatureExtractor, RequestInfo
from routing.router import RoutePlan
from routing.snapshots import SPECULATIVE, EngineMetrics
from routing.state.protocol import StateView
from tests.real_engine.conftest import MODEL, PLAIN_LEVERS, SPEC_LEVERS, Engines
from tests.real_engine.prompts import COPY_PROMPT, user
from tests.real_engine.scrape import Sample, samples
from tests.real_engine.servers import Server, pool_entry, port_of, real_fleet

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(600)]

SUMMED = {
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
    "kv_cache_usage": "vllm:kv_cache_usage_perc",
    "prefix_cache_queries_total": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits_total": "vllm:prefix_cache_hits_total",
    "prompt_tokens_total": "vllm:prompt_tokens_total",
    "generation_tokens_total": "vllm:generation_tokens_total",
    "preemptions_total": "vllm:num_preemptions_total",
    "spec_draft_tokens_total": "vllm:spec_decode_num_draft_tokens_total",
    "spec_accepted_tokens_total": "vllm:spec_decode_num_accepted_tokens_total",
}
"""EngineMetrics field → vLLM sample (one engine per server here, so one label set each)."""

CACHE_INFO = "vllm:cache_config_info"
CACHE_LABELS = {"kv_block_size": "block_size", "kv_blocks_total": "num_gpu_blocks"}
"""EngineMetrics field → label of the info metric that carries it."""

FIELDS = (*SUMMED, *CACHE_LABELS)


def own_reading(url: str) -> dict[str, float | None]:
    """The fields above read straight off the page; None where the page lacks the metric."""
    page = samples(url)
    reading: dict[str, float | None] = {
        field: _sum(page, name) for field, name in SUMMED.items()
    }
    info = [s for s in page if s.name == CACHE_INFO]
    for field, label in CACHE_LABELS.items():
        reading[field] = float(info[0].labels[label]) if info else None
    return reading


def _sum(page: list[Sample], name: str) -> float | None:
    values = [s.value for s in page if s.name == name]
    return sum(values) if values else None


def _as_dict(metrics: EngineMetrics) -> dict[str, float | None]:
    values = {f: getattr(metrics, f) for f in FIELDS}
    return {f: None if v is None else float(v) for f, v in values.items()}


def _exercise(engine: Server) -> None:
    """One copy-heavy request so the token and speculation counters are not all zero."""
    with OpenAI(base_url=engine.url + "/v1", api_key="unused", max_retries=0, timeout=60) as c:
        c.chat.completions.create(model=MODEL, messages=user(COPY_PROMPT), max_tokens=48,
                                  temperature=0)


async def _probe_twice_stable(engine: Server) -> tuple[dict[str, float | None], EngineMetrics]:
    async with aiohttp.ClientSession() as session:
        probe = HttpProbe(session)
        dialect = dialect_for("vllm")
        assert await probe.health(engine.url, dialect) is True
        for _ in range(5):
            before = own_reading(engine.url)
            got = await probe.metrics(engine.url, dialect)
            if own_reading(engine.url) == before:
                return before, got
    raise AssertionError(f"{engine.name}'s counters kept moving while idle")


@pytest.mark.parametrize("which", ["plain", "spec"])
async def test_probe_reads_what_the_engine_reports(engines: Engines, which: str) -> None:
    engine: Server = getattr(engines, which)
    _exercise(engine)
    mine, got = await _probe_twice_stable(engine)
    print(f"\n{which}: {mine}")
    assert _as_dict(got) == pytest.approx(mine)
    assert mine["generation_tokens_total"], "the engine counted no tokens: nothing was compared"
    if which == "spec":
        assert mine["spec_draft_tokens_total"], "no drafts: is speculative decoding on?"
    else:
        assert mine["spec_draft_tokens_total"] is None


async def test_registry_snapshot_carries_the_scrape(engines: Engines) -> None:
    registry = EndpointRegistry(engines.fleet)
    async with aiohttp.ClientSession() as session:
        await Poller(registry, HttpProbe(session)).poll_once()
    by_url = {e.url: e for pool in registry.snapshot() for e in pool.endpoints}
    for engine in (engines.plain, engines.spec):
        endpoint = by_url[engine.url]
        assert endpoint.healthy
        assert _as_dict(endpoint.metrics) == pytest.approx(own_reading(engine.url))


async def test_the_lever_check_finds_each_engine_as_its_pool_declares(engines: Engines) -> None:
    """What the real engines say they run (cache_config_info, the speculative counters, the
    model list's max_model_len) agrees with the fleet file: no mismatch, every gauge 0."""
    registry = EndpointRegistry(engines.fleet)
    async with aiohttp.ClientSession() as session:
        await Poller(registry, HttpProbe(session)).poll_once()
    gauges = CollectorRegistry()
    gauges.register(CircuitGauges(registry))
    expected = {  # vLLM's page says nothing of chunked prefill: unchecked
        engines.plain.url: ("prefix_cache", "speculative", "max_context"),
        engines.spec.url: ("prefix_cache", "speculative", "draft_tokens", "max_context"),
    }
    for url, checked in expected.items():
        check = registry.status(url).lever_check
        print(f"\n{url}: checked {check.checked}, mismatches {check.mismatches}")
        assert (check.checked, check.mismatches) == (checked, ())
        pool = registry.status(url).pool
        assert [gauges.get_sample_value("ridge_lever_mismatch",
                                        {"pool": pool, "endpoint": url, "lever": lever})
                for lever in checked] == [0.0] * len(checked)
    assert all(not e.missing_levers for p in registry.snapshot() for e in p.endpoints)


async def _decide(pools: list[dict[str, Any]]) -> tuple[EndpointRegistry, RoutePlan | None]:
    """Poll the real engines once for a fleet of ``pools`` and route one decode-heavy chat
    (a short prompt asking for 256 tokens) on what the registry then knows."""
    fleet, _ = real_fleet(pools)
    registry = EndpointRegistry(fleet)
    async with aiohttp.ClientSession() as session:
        await Poller(registry, HttpProbe(session)).poll_once()
    features = FeatureExtractor().extract(
        {"model": MODEL, "messages": [user("Tell me a story.")], "max_tokens": 256},
        RequestInfo("chat", MODEL, 256, False, None, None))
    plan = build_router(fleet).choose(features, registry.snapshot(), StateView())
    return registry, plan


def _pool_on(name: str, url: str, levers: dict[str, Any]) -> dict[str, Any]:
    return pool_entry(name, [MODEL], [port_of(url)], levers)


async def test_an_engine_without_a_declared_lever_is_a_mismatch_and_not_routed_for_it(
        engines: Engines) -> None:
    """The same decode-heavy request on two fleet files: with the speculative pool on the
    engine that speculates, the spec rule sends it there (lever ``speculative``); with it
    declared on the engine started without speculation, the check reports the mismatch and
    the router no longer counts on the lever."""
    registry, plan = await _decide([_pool_on("general", engines.plain.url, PLAIN_LEVERS),
                                    _pool_on("spec", engines.spec.url, SPEC_LEVERS)])
    assert registry.status(engines.spec.url).lever_check.mismatches == ()
    assert plan is not None and (plan.decision.pool, plan.decision.lever) == ("spec", SPECULATIVE)

    registry, plan = await _decide([_pool_on("general", engines.spec.url, {}),
                                    _pool_on("spec", engines.plain.url, SPEC_LEVERS)])
    check = registry.status(engines.plain.url).lever_check
    print(f"\ndeclared speculative on {engines.plain.url}: {check.mismatches}; {plan}")
    assert SPECULATIVE in [m.lever for m in check.mismatches]
    spec_pool = next(p for p in registry.snapshot() if p.name == "spec")
    assert SPECULATIVE in spec_pool.endpoints[0].missing_levers
    assert plan is not None and plan.decision.lever != SPECULATIVE
