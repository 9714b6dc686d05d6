"""The comparison's fleets: fair (same GPUs and replica count), routable, rendered on free ports,
with the tokenizer and KV-cache events when asked."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from config.fleet import Fleet, load_fleet
from config.kv_events import address_port
from ridge_bench.harness import gateways
from ridge_bench.harness.fleets import (
    HOMOGENEOUS,
    LEVERS,
    LEVERS_SGLANG,
    RIDGE,
    ROUTERS,
    Extras,
    custom_router,
    distinct,
    parse_gateway,
    publishes_kv_events,
    render,
    with_tokenizer,
)


def _gpus(path: Path) -> list[tuple[str, float, float, str]]:
    fleet = load_fleet(path)
    assert all(p.hardware is not None for p in fleet.pools)
    return sorted((p.hardware.name, p.hardware.peak_flops, p.hardware.mem_bandwidth,
                   repr(p.model)) for p in fleet.pools if p.hardware is not None
                  for _ in p.endpoints)


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


PEERS = {"sglang_ca": ("sglang", "cache_aware"), "sglang_rr": ("sglang", "round_robin"),
         "smg_ca": ("smg", "cache_aware"), "vllm_ca": ("vllm-router", "cache_aware")}


@pytest.mark.parametrize("name", sorted(PEERS))
def test_the_peers_run_the_homogeneous_fleet_behind_their_rust_router(name: str) -> None:
    router = ROUTERS[name]
    kind, policy = PEERS[name]
    assert (router.fleet, router.gateway, router.peer) == (HOMOGENEOUS, f"{kind}:{policy}",
                                                           (kind, policy))
    assert router.scheduler is None and gateways.ROUTERS[kind].name in router.description
    assert router.gateway == parse_gateway(router.gateway)


def test_every_other_router_is_run_by_ridge() -> None:
    others = [r for r in ROUTERS.values() if r.name not in PEERS]
    assert others and all(r.gateway == RIDGE and r.peer is None for r in others)


def test_custom_routers_may_run_behind_any_rust_router(tmp_path: Path) -> None:
    router = custom_router(f"sg={LEVERS}@sglang:round_robin")
    assert (router.name, router.fleet, router.peer) == ("sg", LEVERS, ("sglang", "round_robin"))
    assert custom_router(f"v={LEVERS}@vllm-router:cache_aware").peer == ("vllm-router",
                                                                         "cache_aware")
    assert custom_router(f"s={LEVERS}@smg:random").description.endswith("smg, random")
    assert custom_router(f"r={LEVERS}@ridge").gateway == RIDGE
    odd = tmp_path / "a@b.yaml"  # an @ not followed by a gateway belongs to the path
    assert custom_router(f"odd={odd}").fleet == odd and custom_router(f"odd={odd}").gateway == RIDGE
    for bad in (f"x={LEVERS}@sglang:power_of_two", f"x={LEVERS}@smg:", "x=@sglang:random"):
        with pytest.raises(ValueError):
            custom_router(bad)


def test_parse_gateway() -> None:
    assert parse_gateway("ridge") == "ridge"
    assert parse_gateway("sglang:random") == "sglang:random"
    assert parse_gateway("smg:cache_aware") == "smg:cache_aware"
    for bad in ("sglang", "vllm", "sglang:manual", "vllm:cache_aware", "nginx:round_robin"):
        with pytest.raises(ValueError, match="expected ridge"):
            parse_gateway(bad)


def _event_ports(fleet: Fleet) -> list[int]:
    return [address_port(a) for p in fleet.pools for s in p.kv_event_sources().values()
            for a in (s.publish, s.replay) if a is not None]


@pytest.mark.parametrize("name", list(ROUTERS))
def test_both_extras_give_every_model_the_tokenizer_and_every_prefix_pool_events(
        name: str, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    fleet = render(ROUTERS[name], tmp_path / "f.yaml", itertools.count(40000).__next__,
                   Extras(folder, kv_events=True))
    assert load_fleet(tmp_path / "f.yaml") == fleet
    served = {m for p in fleet.pools for m in p.models}
    tokenizers = fleet.routing.features.tokenizers
    assert set(tokenizers) == served
    assert all(t.path == str(folder.resolve()) and t.required for t in tokenizers.values())
    assert [p.kv_events is not None for p in fleet.pools] == \
        [p.levers.prefix_caching for p in fleet.pools]
    assert any(p.kv_events is not None for p in fleet.pools)
    http = [int(u.rsplit(":", 1)[1]) for p in fleet.pools for u in p.endpoint_urls()]
    events = _event_ports(fleet)
    assert len(events) == 2 * sum(len(p.endpoints) for p in fleet.pools if p.kv_events)
    assert len(set(http + events)) == len(http) + len(events)


def test_without_extras_the_fleet_has_no_tokenizers_and_no_events(tmp_path: Path) -> None:
    fleet = render(ROUTERS["ridge"], tmp_path / "f.yaml", itertools.count(40000).__next__)
    assert fleet.routing.features.tokenizers == {}
    assert all(p.kv_events is None for p in fleet.pools)


def test_the_tokenizer_alone_adds_no_events(tmp_path: Path) -> None:
    fleet = render(ROUTERS["ridge_sglang"], tmp_path / "f.yaml",
                   itertools.count(40000).__next__, Extras(tmp_path))
    assert set(fleet.routing.features.tokenizers) == {"llama-3-8b"}
    assert all(p.kv_events is None for p in fleet.pools)


def test_the_tokenizer_merges_into_the_files_own_features(tmp_path: Path) -> None:
    raw = {"routing": {"features": {"block_tokens": 32}},
           "pools": [{"name": "a", "engine": "vllm", "models": ["m", "n"],
                      "endpoints": ["http://127.0.0.1:1"]}]}
    body = with_tokenizer(raw, Path("rel"))
    features = body["routing"]["features"]
    assert features["block_tokens"] == 32
    assert features["tokenizers"] == {m: {"path": str(Path("rel").resolve()), "required": True}
                                      for m in ("m", "n")}
    assert "routing" not in with_tokenizer({"pools": []}, None)


def test_only_pools_with_prefix_caching_publish_events() -> None:
    assert publishes_kv_events({"engine": "sglang", "levers": {"prefix_caching": True}})
    assert not publishes_kv_events({"engine": "vllm", "levers": {"speculative": {}}})
    assert not publishes_kv_events({"engine": "vllm"})


def test_distinct_ports_skip_repeats() -> None:
    ports = distinct(iter([5, 5, 6, 5, 7]).__next__)
    assert [ports(), ports(), ports()] == [5, 6, 7]
    with pytest.raises(RuntimeError, match="no new port"):
        stuck = distinct(lambda: 1, tries=3)
        stuck()
        stuck()
