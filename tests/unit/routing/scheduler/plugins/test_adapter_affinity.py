"""adapter_affinity: an adapter request reaches only endpoints that have the adapter, those
listing it as loaded first; a base model's request is not restricted."""

from __future__ import annotations

from routing.scheduler.framework import SchedulingContext
from routing.scheduler.plugins.adapter_affinity import AdapterAffinity, adapter_tiers
from routing.snapshots import EndpointSnapshot, PoolSnapshot
from routing.state.protocol import StateView
from tests.unit.routing.scheduler.snapshots import ep, features


def loaded(url: str, *names: str, healthy: bool = True) -> EndpointSnapshot:
    return ep(url, healthy=healthy).replaced(adapters=frozenset(names))


def pool(*endpoints: EndpointSnapshot, declared: frozenset[str] = frozenset()) -> PoolSnapshot:
    return PoolSnapshot("p", "vllm", "mixed", ("m",), endpoints, adapters=declared)


def test_a_base_model_is_not_restricted() -> None:
    assert adapter_tiers(pool(loaded("a", "sql")), "m") is None


def test_loaded_endpoints_first_then_those_that_can_load_it() -> None:
    p = pool(loaded("a"), loaded("b", "sql"), loaded("c"), declared=frozenset({"sql"}))
    assert adapter_tiers(p, "sql") == (frozenset({"b"}), frozenset({"a", "c"}))


def test_an_adapter_only_learned_goes_only_where_it_is_loaded() -> None:
    p = pool(loaded("a"), loaded("b", "sql"))
    assert adapter_tiers(p, "sql") == (frozenset({"b"}),)
    assert adapter_tiers(p, "other") == ()


def test_a_declared_adapter_loaded_nowhere_may_go_anywhere() -> None:
    p = pool(loaded("a"), loaded("b"), declared=frozenset({"sql"}))
    assert adapter_tiers(p, "sql") == (frozenset({"a", "b"}),)


def test_the_filter_keeps_the_best_tier_among_the_candidates() -> None:
    p = pool(loaded("a"), loaded("b", "sql"), loaded("c"), declared=frozenset({"sql"}))
    ctx = SchedulingContext(features(model="sql"), p, StateView())
    plugin = AdapterAffinity()
    assert [e.url for e in plugin.filter(ctx, p.endpoints)] == ["b"]
    # the loaded one already filtered out (unhealthy, saturated): the loadable ones
    assert [e.url for e in plugin.filter(ctx, [p.endpoints[0], p.endpoints[2]])] == ["a", "c"]
    base = SchedulingContext(features(model="m"), p, StateView())
    assert list(plugin.filter(base, p.endpoints)) == list(p.endpoints)
    unknown = SchedulingContext(features(model="nope"), p, StateView())
    assert list(plugin.filter(unknown, p.endpoints)) == []
