"""The simulator's engines pass the lever check: what they say they run over HTTP (vLLM's
``cache_config_info`` and speculative counters, the model list) is what their pool declares,
so ``ridge demo`` and the simulated tests start without a lever mismatch. The fleet starts as
``ridge demo`` starts it, its taken ports moved to free ones (a running demo holds them)."""

from __future__ import annotations

import functools
from pathlib import Path

import aiohttp

from backends.engines.dialects import dialect_for
from backends.engines.probe import HttpProbe
from backends.registry.lever_check import check_levers, declared_facts
from backends.sim import start_fleet
from config.fleet import load_fleet
from gateway.cli.demo_ports import start_sim_fleet

DEMO = Path(__file__).resolve().parents[2] / "gateway" / "demo" / "demo-fleet.yaml"


async def test_the_demo_fleet_runs_what_it_declares() -> None:
    sim, fleet, _ = await start_sim_fleet(load_fleet(DEMO),
                                          functools.partial(start_fleet, seed=1))
    try:
        by_url = {s.configured_url: s.url for s in sim.servers}
        async with aiohttp.ClientSession() as session:
            probe = HttpProbe(session, timeout_s=10)
            checks = {(pool.engine.value, url): check_levers(
                          declared_facts(pool),
                          await probe.facts(by_url[url], dialect_for(pool.engine)))
                      for pool in fleet.pools for url in pool.endpoint_urls()}
    finally:
        await sim.stop()
    assert {key: c.mismatches for key, c in checks.items() if c.mismatches} == {}
    vllm = [set(c.checked) for (engine, _), c in checks.items() if engine == "vllm"]
    # every vLLM stand-in is checked on prefix caching and speculation, K where it speculates
    assert vllm and all({"prefix_cache", "speculative"} <= checked for checked in vllm)
    assert any("draft_tokens" in checked for checked in vllm)
