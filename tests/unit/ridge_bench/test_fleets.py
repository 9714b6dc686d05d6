"""The comparison's fleets: fair (same GPUs and replica count), routable, rendered on free ports."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from backends.fleet_file import load_fleet
from ridge_bench.fleets import (
    HOMOGENEOUS,
    LEVERS,
    LEVERS_SGLANG,
    ROUTERS,
    custom_router,
    render,
)


def _gpus(path: Path) -> list[tuple[str, float, float, str]]:
    fleet = load_fleet(path)
    return sorted((p.hardware.name, p.hardware.peak_flops, p.hardware.mem_bandwidth,
                   repr(p.model)) for p in fleet.pools for _ in p.endpoints)


@pytest.mark.parametrize("levers", [LEVERS, LEVERS_SGLANG], ids=lambda p: p.name)
def test_lever_fleets_have_the_homogeneous_gpus_and_replica_count(levers: Path) -> None:
    assert _gpus(HOMOGENEOUS) == _gpus(levers)
    assert len(_gpus(HOMOGENEOUS)) == 8


def test_the_sglang_variant_differs_only_in_the_prefix_pool_engine() -> None:
    a, b = load_fleet(LEVERS), load_fleet(LEVERS_SGLANG)
    assert [len(p.endpoints) for p in a.pools] == [len(p.endpoints) for p in b.pools]
    assert [p.levers for p in a.pools] == [p.levers for p in b.pools]
    assert [p.engine.value for p in b.pools] == ["sglang", "vllm", "vllm"]


def test_custom_routers_name_a_fleet_file() -> None:
    router = custom_router(f"mine={LEVERS}")
    assert router.name == "mine" and router.fleet == LEVERS and router.scheduler is None
    for bad in ("mine", "=x.yaml", "ridge=x.yaml"):
        with pytest.raises(ValueError):
            custom_router(bad)


def test_the_homogeneous_fleet_is_one_vllm_pool_with_prefix_caching_and_chunked_prefill() -> None:
    (pool,) = load_fleet(HOMOGENEOUS).pools
    assert pool.engine.value == "vllm" and pool.levers.prefix_caching
    assert pool.levers.chunked_prefill is not None and pool.levers.speculative is None


@pytest.mark.parametrize("name", list(ROUTERS))
def test_render_moves_every_endpoint_and_sets_the_scheduler(name: str, tmp_path: Path) -> None:
    ports = itertools.count(40000)
    router = ROUTERS[name]
    fleet = render(router, tmp_path / "f.yaml", lambda: next(ports))
    urls = [u for p in fleet.pools for u in p.endpoint_urls()]
    assert urls == [f"http://127.0.0.1:{40000 + i}" for i in range(len(urls))]
    assert load_fleet(tmp_path / "f.yaml") == fleet
    config = fleet.scheduler_config(fleet.pools[0].name)
    if router.scheduler is not None:
        assert dict(config.scorers) == router.scheduler["scorers"]
        assert config.picker == router.scheduler["picker"]


def test_the_three_baselines_differ_only_in_their_scheduler(tmp_path: Path) -> None:
    configs = []
    for name in ("round_robin", "least_load", "cache_aware"):
        fleet = render(ROUTERS[name], tmp_path / f"{name}.yaml", itertools.count(1000).__next__)
        configs.append(fleet.scheduler_config("general"))
        assert fleet.pools == render(ROUTERS["least_load"], tmp_path / "x.yaml",
                                     itertools.count(1000).__next__).pools
    assert [c.scorers for c in configs] == [(), (("least_load", 1.0),), (("cache_aware", 1.0),)]
    assert configs[0].picker == "round_robin"
