"""The router's one path: the lever policy chooses the pool, the pool's scheduler plugins the
replica; pools whose filters leave nothing are set aside and the policy decides again."""

from __future__ import annotations

from routing.policy import LeverPolicy
from routing.router import Router
from routing.scheduler import PluginSpec, SchedulerConfig, build_scheduler
from routing.snapshots import PREFIX_CACHE, EndpointSnapshot, PoolSnapshot
from tests.unit.routing.scheduler.snapshots import ep, features, view
from tests.unit.routing.test_policy import fleet, lacking


def router(pools: tuple[PoolSnapshot, ...], config: SchedulerConfig | None = None) -> Router:
    return Router(LeverPolicy(), {p.name: build_scheduler(config or SchedulerConfig())
                                  for p in pools})


def test_the_policys_pool_and_the_schedulers_replica() -> None:
    pools = fleet()
    # a long match on r2: the prefix rule picks radix; cache_aware picks the holder
    plan = router(pools).choose(features(blocks=10), pools, view(matched={"r2": 10}))
    assert plan is not None
    assert (plan.decision.pool, plan.decision.lever, plan.endpoint.url) == (
        "radix", PREFIX_CACHE, "r2")
    assert plan.urls == ("r2",) and plan.first == plan.endpoint
    assert [t.name for t in plan.timings] == ["healthy", "cache_aware", "footprint", "max_score"]


def test_a_pair_has_both_sides_chosen_on_the_same_view() -> None:
    pools = fleet(drop=("chunk",))
    busy = {u: 4 for u in ("g1", "g2", "r1", "r2", "s1")}
    plan = router(pools).choose(features(prompt_tokens=3000, blocks=30), pools, view(load=busy))
    assert plan is not None and plan.decision.decode_pool == "decode"
    assert plan.prefill is not None and plan.prefill.url == "p1"
    assert plan.endpoint.url == "d1" and plan.urls == ("p1", "d1") and plan.first.url == "p1"
    assert [t.name for t in plan.timings] == [
        "healthy", "cache_aware", "footprint", "max_score"] * 2


def test_a_pool_whose_filters_leave_nothing_is_set_aside() -> None:
    roomy = SchedulerConfig(filters=("healthy", "roomy"),
                            plugins=(PluginSpec("roomy", "not_saturated", {"max_waiting": 1}),))
    waiting = {u: {"waiting": 3} for u in ("r1", "r2")}  # radix queues, unsaturated for the policy
    pools = fleet(state=waiting)
    plan = router(pools, roomy).choose(features(blocks=10), pools, view(matched={"r2": 10}))
    assert plan is not None and plan.decision.pool != "radix"
    # the same without the filter: radix takes it
    plan = router(pools).choose(features(blocks=10), pools, view(matched={"r2": 10}))
    assert plan is not None and plan.decision.pool == "radix"


def test_tried_endpoints_are_excluded_and_nothing_left_is_none() -> None:
    pools = (PoolSnapshot("only", "vllm", "mixed", ("m",), (ep("a", pool="only"),
                                                             ep("b", pool="only"))),)
    r = router(pools)
    plan = r.choose(features(), pools, view(), exclude=frozenset({"a"}))
    assert plan is not None and plan.endpoint.url == "b"
    assert r.choose(features(), pools, view(), exclude=frozenset({"a", "b"})) is None
    assert r.choose(features(model="unknown"), pools, view()) is None


def test_a_request_sent_for_a_lever_skips_the_endpoints_lacking_it() -> None:
    pools = lacking(fleet(), r2=(PREFIX_CACHE,))
    # a high prefix share sends it to radix for prefix caching; cache_aware would prefer r2,
    # which holds the match but whose engine does not cache prefixes
    plan = router(pools).choose(features(blocks=10), pools,
                                view(prefix_share=0.9, matched={"r2": 10}))
    assert plan is not None and plan.decision.lever == PREFIX_CACHE
    assert plan.endpoint.url == "r1"


def test_a_request_without_a_lever_may_use_any_endpoint() -> None:
    pools = lacking(fleet(state={"g1": {"waiting": 8}, "g2": {"waiting": 8}}),
                    r1=(PREFIX_CACHE,))
    # the general pool is saturated: default traffic goes to radix, lever "none"
    plan = router(pools).choose(features(), pools, view(load={"r2": 1, "c1": 5}))
    assert plan is not None and (plan.decision.pool, plan.decision.lever) == ("radix", "none")
    assert plan.endpoint.url == "r1"


def test_a_pool_whose_only_candidates_lack_the_lever_is_set_aside() -> None:
    """r1 lacks prefix caching and r2, the one that has it, was already tried: radix has no
    candidate for this prefix request, so the policy decides again without it."""
    pools = lacking(fleet(), r1=(PREFIX_CACHE,))
    plan = router(pools).choose(features(), pools, view(prefix_share=0.9),
                                exclude=frozenset({"r2"}))
    assert plan is not None and plan.decision.pool != "radix"


def _lora_pool(*endpoints: EndpointSnapshot, declared: frozenset[str] = frozenset()
               ) -> tuple[PoolSnapshot, ...]:
    return (PoolSnapshot("lora", "vllm", "mixed", ("m",), endpoints, adapters=declared),)


def _with(url: str, *adapters: str, healthy: bool = True) -> EndpointSnapshot:
    return ep(url, healthy=healthy, pool="lora").replaced(adapters=frozenset(adapters))


def test_an_adapter_goes_to_the_endpoint_that_has_it_loaded() -> None:
    pools = _lora_pool(_with("a"), _with("b", "sql"), declared=frozenset({"sql"}))
    # a is idle and b busy: least load would pick a, but b has the adapter loaded
    plan = router(pools).choose(features(model="sql"), pools, view(load={"b": 5}))
    assert plan is not None and plan.endpoint.url == "b"
    plan = router(pools).choose(features(model="m"), pools, view(load={"b": 5}))
    assert plan is not None and plan.endpoint.url == "a"  # the base model: anywhere


def test_an_adapter_falls_back_to_endpoints_that_can_load_it() -> None:
    pools = _lora_pool(_with("a"), _with("b", "sql", healthy=False), declared=frozenset({"sql"}))
    plan = router(pools).choose(features(model="sql"), pools, view())
    assert plan is not None and plan.endpoint.url == "a"
    r = router(pools)
    assert r.choose(features(model="sql"), pools, view(), exclude=frozenset({"a"})) is None


def test_an_adapter_only_learned_from_an_engine_never_goes_elsewhere() -> None:
    pools = _lora_pool(_with("a"), _with("b", "sql"))
    assert pools[0].serves("sql") and not pools[0].serves("other")
    r = router(pools)
    for _ in range(3):
        plan = r.choose(features(model="sql"), pools, view(load={"b": 9}))
        assert plan is not None and plan.endpoint.url == "b"
    assert r.choose(features(model="sql"), pools, view(), exclude=frozenset({"b"})) is None
    assert r.choose(features(model="other"), pools, view()) is None


def test_an_adapter_request_goes_to_the_pool_that_serves_it() -> None:
    plain = PoolSnapshot("plain", "vllm", "mixed", ("m",), (ep("x", pool="plain"),))
    pools = (plain, *_lora_pool(_with("a"), declared=frozenset({"sql"})))
    plan = router(pools).choose(features(model="sql"), pools, view(load={"a": 7}))
    assert plan is not None and (plan.decision.pool, plan.endpoint.url) == ("lora", "a")
