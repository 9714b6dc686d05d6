"""From fleet pools to engine settings: profiles, KV capacity, budgets; the demo fleet file."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.sim.behaviour import SGLANG, VLLM
from backends.sim.clock import VirtualClock
from backends.sim.configure import device_for, engine_config, kv_cache_bytes, profile_for
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
from config.builtin_facts import ACCELERATORS
from config.engines import Engine, Role
from config.fleet import FleetConfigError, load_fleet, parse_fleet
from config.pools import Pool
from routing.formulas import SeqWork
from tests.unit.backends.sim.sim_helpers import make_pool, with_capacity

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
    assert (spec.scheduler.spec_k, spec.spec_acceptance, spec.ngram) == (3, (0.6,), None)
    assert engine_config(make_pool(engine="sglang")).scheduler.mixed_batches is False


def test_profiles_are_found_by_knob_or_hardware_name() -> None:
    assert profile_for(make_pool(hardware="l4")) is HARDWARE["l4"]
    pool = make_pool(hardware="l4", knobs={"profile": "cpu-smollm2"})
    assert profile_for(pool) is HARDWARE["cpu-smollm2"]
    assert profile_for(make_pool(hardware="l4", knobs={"profile": "CPU-SmolLM2"})).kind == "cpu"
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


SHIPPED_FLEETS = ("deploy/fleet.example.yaml", "gateway/demo/demo-fleet.yaml",
                  "gateway/demo/demo-real-fleet.yaml", "deploy/bench/homogeneous.yaml",
                  "deploy/bench/levers.yaml", "deploy/bench/levers-sglang.yaml",
                  "deploy/bench/overload.yaml")


@pytest.mark.parametrize("name", SHIPPED_FLEETS)
def test_every_shipped_fleet_names_a_profile_for_each_pool_it_can_simulate(name: str) -> None:
    pools = [p for p in load_fleet(DEMO.parents[2] / name).pools if not p.missing_facts()]
    assert pools
    for pool in pools:
        assert engine_config(pool).num_blocks > 0  # FleetConfigError for a name of no profile


def test_the_real_demo_fleet_is_simulated_with_its_calibrated_cpu_profile() -> None:
    fleet = load_fleet(DEMO.parent / "demo-real-fleet.yaml")
    for pool in fleet.pools:
        assert profile_for(pool) is HARDWARE["cpu-smollm2"]
        cfg = engine_config(pool)
        assert (cfg.num_blocks, cfg.block_size) == (364, 128)  # as the real metrics page shows


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


def _pool_on(hardware: object, simulator: dict[str, object] | None = None) -> Pool:
    raw = {"name": "p", "engine": "vllm", "models": ["m"], "endpoints": ["http://h:1"],
           "model": "llama-3-8b", "hardware": hardware, "simulator": simulator or {}}
    return parse_fleet({"pools": [raw]}).pools[0]


def test_catalogue_hardware_finds_its_profile_by_any_name() -> None:
    assert profile_for(_pool_on("nvidia-l4")) is HARDWARE["l4"]
    assert profile_for(_pool_on("NVIDIA-H100-SXM")) is HARDWARE["h100-sxm"]
    # every catalogued accelerator has a profile: its datasheet's memory, the GPU overheads
    mi300x = profile_for(_pool_on("amd-mi300x"))
    assert mi300x is HARDWARE["mi300x"] and mi300x.memory_bytes == 192e9
    assert mi300x.overheads == GENERIC_GPU.overheads
    assert engine_config(_pool_on("amd-mi300x")).num_blocks > 0
    for name, spec in ACCELERATORS.items():
        prof = profile_for(_pool_on(name))
        assert (prof.facts.peak_flops, prof.facts.mem_bandwidth) == (spec.peak_flops,
                                                                     spec.mem_bandwidth)
        assert prof.memory_bytes in (spec.memory_bytes, 80 * 2**30)  # 80 GB parts: 80 GiB


FULL_FACTS = {"peak_flops": 1.85e11, "mem_bandwidth": 3.25e10}


def test_an_unknown_hardware_name_stops_the_simulator_naming_the_known_profiles() -> None:
    pool = _pool_on({"name": "cpu-1core", **FULL_FACTS})
    with pytest.raises(FleetConfigError) as err:
        engine_config(pool)
    text = str(err.value)
    assert text.startswith("pool 'p': hardware.name 'cpu-1core' names no hardware profile")
    assert "\n" not in text and "simulator.profile: generic-gpu" in text
    assert all(name in text for name in HARDWARE)
    with pytest.raises(FleetConfigError, match="hardware.name 'unknown'"):  # facts without a name
        engine_config(_pool_on(FULL_FACTS))


def test_the_generic_gpu_is_had_only_by_asking() -> None:
    pool = _pool_on({"name": "cpu-1core", **FULL_FACTS}, {"profile": "generic-gpu"})
    assert profile_for(pool) is GENERIC_GPU
    assert (GENERIC_GPU.kind, GENERIC_GPU.memory_bytes) == ("gpu", 80 * 2**30)
    cfg = engine_config(pool)
    # the pool's own rates, the generic GPU's overheads and 16-token blocks
    assert cfg.device.rates.peak_flops == 1.85e11 and cfg.block_size == 16
    assert cfg.device.overheads == GENERIC_GPU.overheads
    # named by the calibrated profile instead, the same facts get the CPU's overheads and blocks
    cpu = engine_config(_pool_on({"name": "cpu-smollm2", **FULL_FACTS}))
    assert cpu.block_size == 128 and cpu.device.overheads == HARDWARE["cpu-smollm2"].overheads
    assert cpu.device.overheads.step_s > 10 * GENERIC_GPU.overheads.step_s


def test_an_unknown_simulator_profile_stops_the_simulator_naming_the_known_profiles() -> None:
    pool = _pool_on("nvidia-l4", {"profile": "tpu"})
    with pytest.raises(FleetConfigError) as err:
        engine_config(pool)
    text = str(err.value)
    assert text.startswith("pool 'p': simulator.profile 'tpu' is not a hardware profile")
    assert all(name in text for name in HARDWARE)
    with pytest.raises(KeyError, match="known"):
        hardware_profile("tpu")


def test_fp8_kv_halves_bytes_per_token_and_doubles_the_blocks() -> None:
    base = make_pool(model="llama-3-8b", hardware="l4")
    fp8 = with_capacity(base, kv_cache_dtype="fp8")
    # KV bytes per token = 2 · 32 layers · 8 heads · 128 dims · 2 B = 131,072; fp8: 65,536
    assert device_for(base).shape.kv_bytes_per_token == 131_072
    assert device_for(fp8).shape.kv_bytes_per_token == 65_536
    # the same 5.54 GB of KV cache: 2641 blocks of 16 tokens, 5283 with fp8
    assert kv_cache_bytes(fp8, VLLM) == kv_cache_bytes(base, VLLM)
    assert (engine_config(base).num_blocks, engine_config(fp8).num_blocks) == (2641, 5283)
    # the decode step's KV read halves; weights (16.06 GB) do not change
    decodes = [SeqWork(1, 4000)] * 8
    plain, small = device_for(base).step_cost(decodes), device_for(fp8).step_cost(decodes)
    assert plain.read_bytes - small.read_bytes == pytest.approx(8 * 4001 * 65_536)
    assert small.read_bytes == pytest.approx(16.06e9 + 8 * 4001 * 65_536)
    assert small.flops == plain.flops


def test_a_host_tier_is_sized_in_device_blocks_and_reloaded_over_the_host_link() -> None:
    pool = with_capacity(make_pool(model="llama-3-8b", hardware="a100-80gb", prefix_caching=True),
                         host_kv_cache={"size_gb": 64})
    cfg = engine_config(pool)
    assert cfg.host_blocks == 30_517  # ⌊64e9 B ÷ (131,072 B/token · 16 tokens)⌋
    assert cfg.host_link_bandwidth == 25e9  # the hardware fact's default: PCIe Gen4 x16
    assert engine_config(make_pool()).host_blocks == 0
    fp8 = with_capacity(pool, kv_cache_dtype="fp8")
    assert engine_config(fp8).host_blocks == 61_035


def test_sglang_refuses_a_host_tier_not_larger_than_the_device() -> None:
    sglang = make_pool(engine="sglang", model="llama-3-8b", hardware="a100-80gb",
                       prefix_caching=True)
    # device: ⌊(0.88 · 80 GiB − 16.06 GB) ÷ 131,072 B⌋ = 454,188 one-token pages
    assert engine_config(sglang).num_blocks == 454_188
    with pytest.raises(ValueError, match="not more than the device's 454188"):
        engine_config(with_capacity(sglang, host_kv_cache={"size_gb": 32}))  # 244,140 tokens
    assert engine_config(with_capacity(sglang, host_kv_cache={"size_gb": 500})).host_blocks == (
        3_814_697)


def test_drafting_cost_defaults_by_method_and_ngram_takes_its_window() -> None:
    ngram = engine_config(make_pool(spec_k=4, spec_method="ngram"))
    assert (ngram.draft_cost, ngram.ngram, ngram.spec_acceptance) == (0.0, (2, 4), (0.7,))
    eagle = engine_config(make_pool(spec_k=4))
    assert (eagle.draft_cost, eagle.ngram) == (0.05, None)
    given = engine_config(make_pool(spec_k=4, spec_method="ngram", knobs={"draft_cost": 0.01}))
    assert given.draft_cost == 0.01
    curve = engine_config(make_pool(spec_k=4, knobs={"acceptance_by_position": [0.6, 0.5]}))
    assert curve.spec_acceptance == (0.6, 0.5)
