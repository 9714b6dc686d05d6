"""The comparison's fleets: fair (same GPUs and replica count), routable, rendered on free ports."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from backends.config import load_fleet
from bench.fleets import HOMOGENEOUS, LEVERS, ROUTERS, render


def _gpus(path: Path) -> list[tuple[str, float, float, str]]:
    fleet = load_fleet(path)
    return sorted((p.hardware.name, p.hardware.peak_flops, p.hardware.mem_bandwidth,
                   repr(p.model)) for p in fleet.pools for _ in p.endpoints)


def test_both_fleets_have_the_same_gpus_and_replica_count() -> None:
    assert _gpus(HOMOGENEOUS) == _gpus(LEVERS)
    assert len(_gpus(HOMOGENEOUS)) == 8


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
