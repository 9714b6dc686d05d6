"""From fleet pools to engine settings: profiles, KV capacity, budgets; the demo fleet file."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.fleet_file import Engine, FleetConfigError, Pool, Role, load_fleet, parse_fleet
from backends.sim.behaviour import SGLANG, VLLM
from backends.sim.clock import VirtualClock
from backends.sim.configure import engine_config, kv_cache_bytes, profile_for
from backends.sim.endpoint import SimEndpoint
from backends.sim.faults import Faults, parse_command
from backends.sim.pd import KVTransferHub
from backends.sim.profiles import (
    GENERIC_GPU,
    HARDWARE,
    MODELS,
    hardware_profile,
    model_profile,
)
from tests.unit.backends.sim.sim_helpers import make_pool

DEMO = Path(__file__).parents[4] / "gateway" / "demo" / "demo-fleet.yaml"


def test_kv_capacity_is_the_memory_left_after_the_weights() -> None:
    pool = make_pool(model="llama-3-8b", hardware="l4")
    # 0.9 · 24 GB − 8.03e9 · 2 B = 5.54 GB; / (128 KiB per token · 16) = 2641 blocks
    assert kv_cache_bytes(pool, VLLM) == pytest.approx(0.9 * 24e9 - 16.06e9)
    cfg = engine_config(pool)
    assert (cfg.num_blocks, cfg.block_size) == (2641, 16)
    sglang = engine_config(make_pool(engine="sglang", model="llama-3-8b", hardware="l4"))
    assert sglang.block_size == 1
    assert sglang.num_blocks == int((0.88 * 24e9 - 16.06e9) // 131_072)


def test_token_budget_and_levers() -> None:
    assert engine_config(make_pool(chunk=512)).scheduler.token_budget == 512
    assert engine_config(make_pool()).scheduler.token_budget == 8192  # max context, unchunked
    assert engine_config(make_pool(engine="sglang")).scheduler.token_budget == 16384
    spec = engine_config(make_pool(spec_k=3, knobs={"acceptance_rate": 0.6}))
    assert (spec.scheduler.spec_k, spec.spec_alpha) == (3, 0.6)
    assert engine_config(make_pool(engine="sglang")).scheduler.mixed_batches is False


def test_profiles_are_found_by_knob_or_hardware_name() -> None:
    assert profile_for(make_pool(hardware="l4")) is HARDWARE["l4"]
    pool = make_pool(hardware="l4", knobs={"profile": "cpu-smollm2"})
    assert profile_for(pool) is HARDWARE["cpu-smollm2"]
    with pytest.raises(KeyError, match="known"):
        profile_for(make_pool(knobs={"profile": "tpu"}))
    assert model_profile("qwen2.5-7b").kv_heads == 4
    with pytest.raises(KeyError):
        hardware_profile("nope")
    assert set(MODELS) >= {"llama-3-8b", "llama-2-7b", "llama-3-70b", "qwen2.5-7b", "smollm2-135m"}


def test_demo_fleet_has_the_four_kinds_of_pools() -> None:
    fleet = load_fleet(DEMO)
    by_name = {p.name: p for p in fleet.pools}
    assert any(p.engine is Engine.VLLM and p.levers.speculative for p in fleet.pools)
    assert any(
        p.engine is Engine.SGLANG and p.levers.prefix_caching and len(p.endpoints) > 1
        for p in fleet.pools
    )
    assert any(p.engine is Engine.VLLM and p.levers.chunked_prefill for p in fleet.pools)
    prefill = [p for p in fleet.pools if p.role is Role.PREFILL]
    assert prefill and by_name[prefill[0].pair or ""].role is Role.DECODE
    assert all("smollm2-135m" in p.models for p in fleet.pools)
    ports = sorted(int(u.rsplit(":", 1)[1]) for p in fleet.pools for u in p.endpoint_urls())
    assert ports[0] == 18101 and ports == list(range(18101, 18101 + len(ports)))
    for pool in fleet.pools:
        engine_config(pool)


def test_fault_rules_and_commands() -> None:
    faults = Faults()
    faults.set("delay", 1.5, count=2)
    assert faults.take("delay") == 1.5 and faults.take("delay") == 1.5
    assert faults.take("delay") is None
    assert parse_command({"kind": "reset", "after_chunks": 3}).value == 3
    assert parse_command({"kind": "error"}).value == 503
    assert parse_command({"kind": "close", "duration_s": 2}).value == 2
    bad: object
    for bad in (
        {"kind": "melt"},
        {"kind": "delay", "delay_s": -1},
        {"kind": "delay", "count": 0},
        [],
    ):
        with pytest.raises(ValueError):
            parse_command(bad)
    assert SGLANG.health_paths == ("/health", "/health_generate")


def test_a_kv_cache_smaller_than_the_context_is_refused() -> None:
    pool = make_pool(model="llama-3-8b", hardware="l4")
    tiny = pool.model_copy(
        update={"hardware": pool.hardware.model_copy(update={"kv_cache_bytes": 131_072 * 1000})}
    )
    with pytest.raises(ValueError, match="fewer than max_context 8192"):
        engine_config(tiny)


def test_a_pool_without_facts_cannot_be_simulated() -> None:
    pool = make_pool().model_copy(update={"hardware": None})
    with pytest.raises(FleetConfigError, match="pool 'p' cannot be simulated: the fleet file "
                                               "gives no hardware facts"):
        engine_config(pool)
    bare = pool.model_copy(update={"model": None})
    with pytest.raises(FleetConfigError, match="no model and no hardware facts"):
        SimEndpoint(bare, 0, 1, VirtualClock(), KVTransferHub(), seed=0)


def test_catalogue_hardware_finds_its_profile_by_any_name() -> None:
    def pool_on(hardware: str) -> Pool:
        raw = {"name": "p", "engine": "vllm", "models": ["m"], "endpoints": ["http://h:1"],
               "model": "llama-3-8b", "hardware": hardware}
        return parse_fleet({"pools": [raw]}).pools[0]

    assert profile_for(pool_on("nvidia-l4")) is HARDWARE["l4"]
    assert profile_for(pool_on("NVIDIA-H100-SXM")) is HARDWARE["h100-sxm"]
    # known to the catalogue, not calibrated: a generic GPU with the datasheet's memory
    mi300x = profile_for(pool_on("amd-mi300x"))
    assert mi300x.memory_bytes == 192e9 and mi300x.overheads == GENERIC_GPU.overheads
    assert engine_config(pool_on("amd-mi300x")).num_blocks > 0
