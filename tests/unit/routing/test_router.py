"""The router's one path: the lever policy chooses the pool, the pool's scheduler plugins the
replica; pools whose filters leave nothing are set aside and the policy decides again."""

from __future__ import annotations

from routing.policy import LeverPolicy
from routing.router import Router
from routing.scheduler import PluginSpec, SchedulerConfig, build_scheduler
from routing.snapshots import PREFIX_CACHE, PoolSnapshot
from tests.unit.routing.scheduler.snapshots import ep, features, view
from tests.unit.routing.test_policy import fleet


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
    assert [t.name for t in plan.timings] == ["healthy", "cache_aware", "max_score"]


def test_a_pair_has_both_sides_chosen_on_the_same_view() -> None:
    pools = fleet(drop=("chunk",))
    busy = {u: 4 for u in ("g1", "g2", "r1", "r2", "s1")}
    plan = router(pools).choose(features(prompt_tokens=3000, blocks=30), pools, view(load=busy))
    assert plan is not None and plan.decision.decode_pool == "decode"
    assert plan.prefill is not None and plan.prefill.url == "p1"
    assert plan.endpoint.url == "d1" and plan.urls == ("p1", "d1") and plan.first.url == "p1"
    assert [t.name for t in plan.timings] == ["healthy", "cache_aware", "max_score"] * 2


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
