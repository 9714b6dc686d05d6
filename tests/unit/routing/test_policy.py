"""The lever policy over hand-built fleets: each rule firing, each fall-back, the ridge gate."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from routing.decision import RouteDecision, reason_values
from routing.features import RequestFeatures
from routing.policy import (
    DEFAULT_RULES,
    POOL_LOAD_SCALE,
    LeverPolicy,
    PolicyConfig,
    PolicyInput,
)
from routing.snapshots import (
    CHUNKED_PREFILL,
    FP8_KV_CACHE,
    HOST_KV_CACHE,
    PD_DISAGGREGATION,
    PREFIX_CACHE,
    SPECULATIVE,
    PoolSnapshot,
)
from routing.state.protocol import StateView
from tests.unit.routing.scheduler.snapshots import ep, features, view

# name: (role, levers, pair, ridge_tokens, endpoint URLs)
LAYOUT: dict[str, tuple[str, tuple[str, ...], str | None, float, tuple[str, ...]]] = {
    "general": ("mixed", (), None, 0.0, ("g1", "g2")),
    "radix": ("mixed", (PREFIX_CACHE,), None, 0.0, ("r1", "r2")),
    "spec": ("mixed", (SPECULATIVE,), None, 100.0, ("s1",)),
    "chunk": ("mixed", (CHUNKED_PREFILL,), None, 0.0, ("c1",)),
    "prefill": ("prefill", (PD_DISAGGREGATION,), "decode", 0.0, ("p1",)),
    "decode": ("decode", (PD_DISAGGREGATION,), None, 0.0, ("d1",)),
}
MIXED_URLS = ("g1", "g2", "r1", "r2", "s1", "c1")
BUSY = {u: 4 for u in MIXED_URLS}  # 4 requests per mixed endpoint: "under load"
GENERAL_URLS = ("g1", "g2", "r1", "r2", "c1")  # the mixed pools without speculation
GENERAL_BUSY = {u: 5 for u in GENERAL_URLS}


def fleet(drop: tuple[str, ...] = (), models: dict[str, tuple[str, ...]] | None = None,
          state: dict[str, dict[str, Any]] | None = None) -> tuple[PoolSnapshot, ...]:
    """The standard fleet; ``state`` sets endpoint fields by URL (``{"g1": {"waiting": 9}}``)."""
    state = state or {}
    pools = []
    for name, (role, levers, pair, ridge, urls) in LAYOUT.items():
        if name in drop:
            continue
        endpoints = tuple(ep(u, pool=name, **state.get(u, {})) for u in urls)
        served = (models or {}).get(name, ("m",))
        pools.append(PoolSnapshot(name, "vllm", role, served, endpoints, frozenset(levers),
                                  pair if pair not in drop else None, ridge))
    return tuple(pools)


def saturated(*urls: str) -> dict[str, dict[str, Any]]:
    return {u: {"waiting": 8} for u in urls}


def down(*urls: str) -> dict[str, dict[str, Any]]:
    return {u: {"healthy": False} for u in urls}


@dataclass
class Case:
    id: str
    expected: tuple[str, str | None, str, str]  # pool, decode pool, lever, reason
    pools: tuple[PoolSnapshot, ...] = field(default_factory=fleet)
    features: RequestFeatures = field(default_factory=features)
    view: StateView = field(default_factory=view)
    detail: str | None = None


CASES = [
    Case("plain request → general", ("general", None, "none", "default"), detail="load=0.0"),
    Case("default spreads load over general pools",
         ("radix", None, "none", "default"), view=view(load={"g1": 2, "g2": 2, "c1": 1})),
    # pd
    Case("long uncached under load → the prefill/decode pair",
         ("prefill", "decode", PD_DISAGGREGATION, "long_uncached_under_load"),
         features=features(prompt_tokens=3000), view=view(load=BUSY),
         detail="uncached=3000,load=4.0"),
    Case("no pair configured → the chunked-prefill pool",
         ("chunk", None, CHUNKED_PREFILL, "long_uncached_under_load"),
         pools=fleet(drop=("prefill", "decode")), features=features(prompt_tokens=3000),
         view=view(load=BUSY)),
    Case("saturated pair → chunked prefill within the rule",
         ("chunk", None, CHUNKED_PREFILL, "long_uncached_under_load"),
         pools=fleet(state=saturated("p1")), features=features(prompt_tokens=3000),
         view=view(load=BUSY)),
    Case("pair with its decode side down → chunked prefill",
         ("chunk", None, CHUNKED_PREFILL, "long_uncached_under_load"),
         pools=fleet(state=down("d1")), features=features(prompt_tokens=3000),
         view=view(load=BUSY)),
    Case("long prompt without load → not pd",
         ("general", None, "none", "default"), features=features(prompt_tokens=3000)),
    Case("long prompt under load but mostly cached → prefix, not pd",
         ("radix", None, PREFIX_CACHE, "long_match"), features=features(prompt_tokens=3000),
         view=view(load=BUSY, matched={"r2": 25}), detail="f=na,match=25/30"),
    Case("pd pair and chunk pool both saturated → next rule, reason says so",
         ("general", None, "none", "pd>fallback_saturated"),
         pools=fleet(state=saturated("p1", "c1")), features=features(prompt_tokens=3000),
         view=view(load=BUSY)),
    # prefix
    Case("high prefix share → radix", ("radix", None, PREFIX_CACHE, "high_prefix_share"),
         view=view(prefix_share=0.8), detail="f=0.80,match=0/10"),
    Case("long match in blocks", ("radix", None, PREFIX_CACHE, "long_match"),
         features=features(prompt_tokens=4000), view=view(matched={"r1": 8}),
         detail="f=na,match=8/40"),
    Case("long match as a fraction of the prompt", ("radix", None, PREFIX_CACHE, "long_match"),
         features=features(prompt_tokens=400), view=view(matched={"r2": 2, "g1": 4}),
         detail="f=na,match=2/4"),
    Case("a match the engines reported through their KV events says so",
         ("radix", None, PREFIX_CACHE, "long_match"), features=features(prompt_tokens=4000),
         view=view(matched={"r1": 8}).replaced(exact_endpoints=frozenset({"r1", "r2"})),
         detail="f=na,match=8/40,index=events"),
    Case("a match on a pool without prefix caching does not fire the rule",
         ("general", None, "none", "default"), view=view(matched={"g1": 10})),
    Case("low share, short match → default", ("general", None, "none", "default"),
         features=features(prompt_tokens=4000), view=view(prefix_share=0.3, matched={"r1": 3})),
    Case("saturated prefix pool → next rule",
         ("general", None, "none", "prefix>fallback_saturated"),
         pools=fleet(state=saturated("r1", "r2")), view=view(prefix_share=0.9),
         detail="f=0.90,match=0/10,load=0.0"),
    Case("unhealthy prefix pool → next rule",
         ("general", None, "none", "prefix>fallback_unhealthy"),
         pools=fleet(state=down("r1", "r2")), view=view(prefix_share=0.9)),
    Case("decode-heavy with a high prefix share → spec (tried before prefix)",
         ("spec", None, SPECULATIVE, "low_load_decode_heavy"),
         features=features(prompt_tokens=100, output=800), view=view(prefix_share=0.9)),
    Case("saturated spec pool → prefix when prefix fires",
         ("radix", None, PREFIX_CACHE, "spec>fallback_saturated"),
         pools=fleet(state=saturated("s1")), features=features(prompt_tokens=100, output=800),
         view=view(prefix_share=0.9)),
    Case("two rules lose the request: the first is named",
         ("general", None, "none", "spec>fallback_unhealthy"),
         pools=fleet(state={**saturated("r1", "r2"), **down("s1")}),
         features=features(prompt_tokens=100, output=800), view=view(prefix_share=0.9)),
    # spec
    Case("decode-heavy at low load → spec", ("spec", None, SPECULATIVE, "low_load_decode_heavy"),
         features=features(prompt_tokens=100, output=800),
         detail="out=800,in=100,batch=0.0/50.0"),
    Case("output below the ratio → not spec", ("general", None, "none", "default"),
         features=features(prompt_tokens=500, output=999)),
    Case("unhealthy spec pool → default", ("general", None, "none", "spec>fallback_unhealthy"),
         pools=fleet(state=down("s1")), features=features(prompt_tokens=100, output=800)),
    Case("saturated spec pool → default", ("general", None, "none", "spec>fallback_saturated"),
         pools=fleet(state=saturated("s1")), features=features(prompt_tokens=100, output=800)),
    Case("spec pool at the ridge → default", ("general", None, "none", "spec>fallback_near_ridge"),
         features=features(prompt_tokens=100, output=800), view=view(load={"s1": 50}),
         detail="out=800,in=100,batch=50.0/50.0,load=0.0"),
    # idle_spec: ridge_tokens 100, K = 0 → the spec cap is 50, the idle room 0.25 × 50 = 12.5
    Case("busy general pools, idle spec pool → ordinary work takes its spare room",
         ("spec", None, "none", "idle_spec_capacity"), view=view(load=GENERAL_BUSY),
         detail="load=5.0/0.0,batch=0.0/12.5"),
    Case("f alone, busy general pools → the idle spec pool too",
         ("spec", None, "none", "idle_spec_capacity"),
         view=view(load=GENERAL_BUSY, prefix_share=0.9), detail="load=5.0/0.0,batch=0.0/12.5"),
    Case("a long match stays with its cache, however busy",
         ("radix", None, PREFIX_CACHE, "long_match"), features=features(prompt_tokens=1600),
         view=view(load=GENERAL_BUSY, matched={"r1": 8})),
    Case("spec pool past its idle room → ordinary work stays general, no fallback named",
         ("general", None, "none", "default"), view=view(load={**GENERAL_BUSY, "s1": 13}),
         detail="load=5.0"),
    Case("... while a decode-heavy request still gets speculation there",
         ("spec", None, SPECULATIVE, "low_load_decode_heavy"),
         features=features(prompt_tokens=100, output=800),
         view=view(load={**GENERAL_BUSY, "s1": 13}), detail="out=800,in=100,batch=13.0/50.0"),
    Case("general pools about as idle as the spec pool → general",
         ("general", None, "none", "default"), view=view(load={u: 3 for u in GENERAL_URLS})),
    # default and last resort
    Case("general pool saturated → the next general pool",
         ("radix", None, "none", "default"), pools=fleet(state=saturated("g1", "g2"))),
    Case("every general pool saturated, spec pool past its idle room → least-loaded open pool, "
         "reason says so", ("spec", None, "none", "default>fallback_saturated"),
         pools=fleet(drop=("prefill", "decode"), state=saturated("g1", "g2", "r1", "r2", "c1")),
         view=view(load={"s1": 13})),
    Case("every general pool saturated, spec pool idle → its spare room",
         ("spec", None, "none", "idle_spec_capacity"),
         pools=fleet(state=saturated("g1", "g2", "r1", "r2", "c1")),
         detail="load=inf/0.0,batch=0.0/12.5"),
    Case("every pool saturated → least-loaded of them",
         ("prefill", "decode", PD_DISAGGREGATION, "default>fallback_saturated"),
         pools=fleet(state=saturated("g1", "g2", "r1", "r2", "c1", "s1", "p1")),
         view=view(load={u: 9 for u in MIXED_URLS})),  # 9 in flight vs the pair's 8 waiting
    Case("no general pool → least-loaded mixed pool serving the model",
         ("spec", None, "none", "default"),
         pools=fleet(drop=("general", "radix", "chunk"))),
    Case("only pool serving the model", ("radix", None, "none", "only_pool"),
         pools=fleet(models={"radix": ("m", "solo")}), features=features(model="solo"),
         detail="load=0.0"),
    Case("only healthy pool serving the model", ("chunk", None, "none", "only_pool"),
         pools=fleet(models={"general": ("solo",), "chunk": ("solo",)}, state=down("g1", "g2")),
         features=features(model="solo")),
    Case("a decode pool alone is not a place to send a request",
         ("prefill", "decode", PD_DISAGGREGATION, "only_pool"),
         pools=fleet(drop=("general", "radix", "spec", "chunk"))),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_decisions(case: Case) -> None:
    decision = LeverPolicy().decide(PolicyInput(case.features, case.pools, case.view))
    assert decision is not None
    got = (decision.pool, decision.decode_pool, decision.lever, decision.reason)
    assert got == case.expected, decision
    assert decision.reason in reason_values(r.name for r in DEFAULT_RULES)
    assert ";" not in decision.detail
    if case.detail is not None:
        assert decision.detail == case.detail


@pytest.mark.parametrize(
    "pools",
    [
        fleet(models={name: ("other",) for name in LAYOUT}),  # nobody serves the model
        fleet(state=down("g1", "g2", "r1", "r2", "s1", "c1", "p1")),  # nobody healthy
        fleet(drop=("general", "radix", "spec", "chunk"), state=down("d1")),  # pair without decode
        (),
    ],
)
def test_no_decision_when_no_healthy_pool_serves_the_model(
        pools: tuple[PoolSnapshot, ...]) -> None:
    assert LeverPolicy().decide(PolicyInput(features(), pools, view())) is None


# Speculation moves away as the spec pool's decode batch nears the ridge: ridge_tokens = 100,
# spec_max_ridge_fraction = 0.5 → speculation while < 50 requests per healthy endpoint.
RIDGE_TABLE = [(0, "spec"), (25, "spec"), (49, "spec"), (50, "general"), (51, "general"),
               (80, "general"), (200, "general")]


@pytest.mark.parametrize(("requests", "pool"), RIDGE_TABLE)
def test_speculation_switch_point(requests: int, pool: str) -> None:
    inp = PolicyInput(features(prompt_tokens=100, output=800), fleet(),
                      view(load={"s1": requests}))
    decision = LeverPolicy().decide(inp)
    assert decision is not None and decision.pool == pool


def test_switch_point_follows_the_fraction_and_counts_engine_load() -> None:
    config = PolicyConfig(spec_max_ridge_fraction=0.25)  # → 25 requests
    for requests, expected in [(24, "spec"), (25, "general")]:
        inp = PolicyInput(features(prompt_tokens=100, output=800), fleet(),
                          view(load={"s1": requests}))
        got = LeverPolicy(config).decide(inp)
        assert got is not None and got.pool == expected, requests
    # 10 in flight through the router, but the engine runs 50 (others send to it too): 50 ≥ 50
    inp = PolicyInput(features(prompt_tokens=100, output=800),
                      fleet(state={"s1": {"running": 50}}), view(load={"s1": 10}))
    got = LeverPolicy().decide(inp)
    assert got is not None and got.reason == "spec>fallback_near_ridge"


@pytest.mark.parametrize(("draft_tokens", "requests", "pool", "detail"), [
    (4, 9, "spec", "out=800,in=100,batch=9.0/10.0"),  # 0.5 × 100 / (4 + 1) = 10 sequences
    (4, 10, "general", "out=800,in=100,batch=10.0/10.0,load=0.0"),
    (1, 24, "spec", "out=800,in=100,batch=24.0/25.0"),  # 0.5 × 100 / 2 = 25
    (1, 25, "general", "out=800,in=100,batch=25.0/25.0,load=0.0"),
])
def test_the_cap_counts_the_verify_tokens_of_each_sequence(
        draft_tokens: int, requests: int, pool: str, detail: str) -> None:
    pools = tuple(p.replaced(draft_tokens=draft_tokens) if p.name == "spec" else p
                  for p in fleet())
    inp = PolicyInput(features(prompt_tokens=100, output=800), pools,
                      view(load={"s1": requests}))
    got = LeverPolicy().decide(inp)
    assert got is not None and (got.pool, got.detail) == (pool, detail)


def test_spec_pool_with_unknown_ridge_is_not_used_for_speculation() -> None:
    pools = tuple(p.replaced(ridge_tokens=0.0) for p in fleet())
    got = LeverPolicy().decide(PolicyInput(features(prompt_tokens=100, output=800), pools, view()))
    assert got is not None and (got.pool, got.reason) == ("general", "spec>fallback_near_ridge")


def test_rule_order_and_enabled_rules_come_from_config() -> None:
    both = PolicyInput(features(prompt_tokens=100, output=800), fleet(), view(prefix_share=0.9))
    assert _pool(LeverPolicy().decide(both)) == "spec"
    assert _pool(LeverPolicy(PolicyConfig(rules=("prefix", "spec", "default"))).decide(both)) \
        == "radix"
    assert _pool(LeverPolicy(PolicyConfig(rules=("default",))).decide(both)) == "general"
    # no rule at all: the least-loaded open pool
    none = LeverPolicy(PolicyConfig(rules=())).decide(both)
    assert none is not None and (none.pool, none.reason) == ("general", "default")


def test_thresholds_come_from_config() -> None:
    inp = PolicyInput(features(), fleet(), view(prefix_share=0.4))
    assert _pool(LeverPolicy().decide(inp)) == "general"
    assert _pool(LeverPolicy(PolicyConfig(high_prefix_share=0.4)).decide(inp)) == "radix"
    long_ = PolicyInput(features(prompt_tokens=1500), fleet(), view(load=BUSY))
    assert _pool(LeverPolicy().decide(long_)) == "general"
    assert _pool(LeverPolicy(PolicyConfig(long_prompt_tokens=1500)).decide(long_)) == "prefill"


def test_prefix_prefers_the_pool_holding_the_longest_match() -> None:
    pools = (*fleet(), PoolSnapshot("radix2", "sglang", "mixed", ("m",),
                                    (ep("x1", pool="radix2"),), frozenset({PREFIX_CACHE})))
    inp = PolicyInput(features(), pools, view(prefix_share=0.9, matched={"r1": 2, "x1": 6}))
    got = LeverPolicy().decide(inp)
    assert got is not None and (got.pool, got.detail) == ("radix2", "f=0.90,match=6/10")


@pytest.mark.parametrize(("load", "pool"), [
    # pools are ordered by the cache cost with every request on an endpoint counted as one
    # queued (POOL_LOAD_SCALE 1): uncached × (load + 1)
    ({"r1": 1}, "radix"),  # r1: 400 uncached × 2 = 800 < x1: 1000 × 1
    ({"r1": 3, "r2": 1}, "radix2"),  # r1: 400 × 4 = 1600, r2: 1000 × 2 > x1: 1000 × 1
    ({"r1": 3}, "radix"),  # r2 idle costs 1000 too: a tie keeps fleet order
])
def test_prefix_leaves_the_pool_holding_the_match_when_recomputing_elsewhere_is_cheaper(
        load: dict[str, int], pool: str) -> None:
    pools = (*fleet(), PoolSnapshot("radix2", "sglang", "mixed", ("m",),
                                    (ep("x1", pool="radix2"),), frozenset({PREFIX_CACHE})))
    inp = PolicyInput(features(), pools, view(prefix_share=0.9, matched={"r1": 6}, load=load))
    assert _pool(LeverPolicy().decide(inp)) == pool


def test_pools_are_ordered_at_their_own_load_scale() -> None:
    assert POOL_LOAD_SCALE == 1.0
    # at the replica scorer's scale (2) r1 would cost 400 × 2.5 = 1,000, a tie with x1 that
    # keeps fleet order; at the pools' scale it costs 400 × 4 = 1,600 and radix2 goes first
    pools = (*fleet(), PoolSnapshot("radix2", "sglang", "mixed", ("m",),
                                    (ep("x1", pool="radix2"),), frozenset({PREFIX_CACHE})))
    inp = PolicyInput(features(), pools,
                      view(prefix_share=0.9, matched={"r1": 6}, load={"r1": 3, "r2": 3}))
    assert _pool(LeverPolicy().decide(inp)) == "radix2"


def test_unknown_or_repeated_rules_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown policy rules"):
        LeverPolicy(PolicyConfig(rules=("prefix", "radix")))
    with pytest.raises(ValueError, match="listed twice"):
        LeverPolicy(PolicyConfig(rules=("prefix", "prefix")))


def test_header_of_a_real_decision() -> None:
    inp = PolicyInput(features(prompt_tokens=1600), fleet(),
                      view(prefix_share=0.82, matched={"r2": 14}))
    got = LeverPolicy().decide(inp)
    assert got is not None
    assert got.header_value() == "pool=radix; lever=prefix_cache; reason=long_match; " \
                                 "f=0.82,match=14/16"


def _pool(decision: RouteDecision | None) -> str | None:
    return decision.pool if decision else None


# -- levers the engines do not run (the registry's lever check) --------------------------------


def lacking(pools: tuple[PoolSnapshot, ...], **missing: tuple[str, ...]
            ) -> tuple[PoolSnapshot, ...]:
    """``pools`` with the endpoints named in ``missing`` (URL → levers) lacking those levers."""
    def endpoint(e: Any) -> Any:
        return e.replaced(missing_levers=frozenset(missing.get(e.url, ())))
    return tuple(p.replaced(endpoints=tuple(endpoint(e) for e in p.endpoints)) for p in pools)


DECODE_HEAVY = features(prompt_tokens=100, output=800)
OTHERS_BUSY = view(load={"g1": 2, "g2": 2, "r1": 2, "r2": 2, "c1": 2})


@pytest.mark.parametrize(("pools", "inp_features", "state", "expected"), [
    # a spec pool whose engine does not speculate: no spec target, and a general pool now
    (lacking(fleet(), s1=(SPECULATIVE,)), DECODE_HEAVY, view(), ("general", "none", "default")),
    (fleet(), features(), OTHERS_BUSY, ("general", "none", "default")),
    (lacking(fleet(), s1=(SPECULATIVE,)), features(), OTHERS_BUSY, ("spec", "none", "default")),
    # one of radix's two engines caches prefixes: radix keeps the lever
    (lacking(fleet(), r1=(PREFIX_CACHE,)), features(), view(prefix_share=0.9),
     ("radix", PREFIX_CACHE, "high_prefix_share")),
    # neither does: the prefix rule has no pool left
    (lacking(fleet(), r1=(PREFIX_CACHE,), r2=(PREFIX_CACHE,)), features(),
     view(prefix_share=0.9), ("general", "none", "default")),
    # the one that does is down: the same
    (lacking(fleet(state=down("r2")), r1=(PREFIX_CACHE,)), features(), view(prefix_share=0.9),
     ("general", "none", "default")),
    # a long match held where prefix caching is off is no match
    (fleet(), features(blocks=10), view(matched={"r1": 10}), ("radix", PREFIX_CACHE, "long_match")),
    (lacking(fleet(), r1=(PREFIX_CACHE,)), features(blocks=10), view(matched={"r1": 10}),
     ("general", "none", "default")),
    # no chunked prefill where the pool declares it: pd falls to the general pool
    (lacking(fleet(drop=("prefill", "decode")), c1=(CHUNKED_PREFILL,)),
     features(prompt_tokens=3000), view(load=BUSY), ("general", "none", "default")),
])
def test_a_lever_no_healthy_engine_of_a_pool_runs_is_not_counted_on(
        pools: tuple[PoolSnapshot, ...], inp_features: RequestFeatures, state: StateView,
        expected: tuple[str, str, str]) -> None:
    got = LeverPolicy().decide(PolicyInput(inp_features, pools, state))
    assert got is not None and (got.pool, got.lever, got.reason) == expected, got


# -- the request's own evidence (long match, session, or only the workload's f) ----------------


def spec_caches_too() -> tuple[PoolSnapshot, ...]:
    """The standard fleet with the speculative pool also caching prefixes (as the demo's)."""
    return tuple(p.replaced(levers=frozenset({SPECULATIVE, PREFIX_CACHE})) if p.name == "spec"
                 else p for p in fleet())


RADIX_BUSY = view(prefix_share=0.73, load={"r1": 3, "r2": 3})
LONG_UNIQUE = features(prompt_tokens=2600, output=64)


def test_a_long_unique_prompt_never_goes_to_speculation_on_the_workloads_f() -> None:
    # the spec pool is idle and caches prefixes, so on cache cost alone it would win; but the
    # request brings no match and no session: f is other traffic's evidence
    got = LeverPolicy().decide(PolicyInput(LONG_UNIQUE, spec_caches_too(), RADIX_BUSY))
    assert got is not None
    assert got.header_value() == ("pool=radix; lever=prefix_cache; reason=high_prefix_share; "
                                  "f=0.73,match=0/26")


def test_with_only_speculative_prefix_pools_f_alone_places_nothing_there() -> None:
    pools = tuple(p for p in spec_caches_too() if p.name != "radix")
    got = LeverPolicy().decide(PolicyInput(LONG_UNIQUE, pools, view(prefix_share=0.9)))
    assert got is not None and (got.pool, got.lever, got.reason) == ("general", "none", "default")


def test_a_long_match_held_by_the_speculative_pool_is_evidence_for_it() -> None:
    got = LeverPolicy().decide(PolicyInput(LONG_UNIQUE, spec_caches_too(),
                                           view(prefix_share=0.73, matched={"s1": 20})))
    assert got is not None and (got.pool, got.reason, got.detail) == \
        ("spec", "long_match", "f=0.73,match=20/26")


@pytest.mark.parametrize(("session_endpoint", "share", "expected", "detail"), [
    # the session last ran on the speculative pool, which caches: its history is there
    ("s1", None, ("spec", PREFIX_CACHE, "session_follow_up"), "f=na,match=0/26,session=spec"),
    ("r2", 0.9, ("radix", PREFIX_CACHE, "session_follow_up"), "f=0.90,match=0/26,session=radix"),
    # a session on a pool without prefix caching is no evidence for the prefix lever
    ("g1", None, ("general", "none", "default"), None),
    ("g1", 0.9, ("radix", PREFIX_CACHE, "high_prefix_share"), "f=0.90,match=0/26"),
    ("gone", None, ("general", "none", "default"), None),
])
def test_a_session_follow_up_returns_to_the_pool_it_last_used(
        session_endpoint: str, share: float | None, expected: tuple[str, str, str],
        detail: str | None) -> None:
    feats = features(prompt_tokens=2600, output=64, session="abc")
    got = LeverPolicy().decide(PolicyInput(
        feats, spec_caches_too(), view(prefix_share=share, session_endpoint=session_endpoint)))
    assert got is not None and (got.pool, got.lever, got.reason) == expected, got
    if detail is not None:
        assert got.detail == detail


def test_a_session_endpoint_is_no_evidence_without_a_session_on_the_request() -> None:
    got = LeverPolicy().decide(PolicyInput(LONG_UNIQUE, spec_caches_too(),
                                           view(session_endpoint="s1")))
    assert got is not None and got.reason == "default"


def test_a_saturated_session_pool_hands_the_follow_up_to_a_general_caching_pool() -> None:
    pools = tuple(p.replaced(levers=frozenset({SPECULATIVE, PREFIX_CACHE})) if p.name == "spec"
                  else p for p in fleet(state=saturated("s1")))
    feats = features(prompt_tokens=2600, output=64, session="abc")
    got = LeverPolicy().decide(PolicyInput(feats, pools, view(session_endpoint="s1")))
    assert got is not None and (got.pool, got.reason) == ("radix", "session_follow_up")


def test_a_session_on_an_endpoint_that_does_not_cache_is_no_evidence() -> None:
    pools = lacking(spec_caches_too(), s1=(PREFIX_CACHE,))
    feats = features(prompt_tokens=2600, output=64, session="abc")
    got = LeverPolicy().decide(PolicyInput(feats, pools, view(session_endpoint="s1")))
    assert got is not None and got.reason == "default"


# -- ordinary work on a speculative pool's spare room (idle_spec) ------------------------------


# The spec pool's idle room is 12.5 sequences (0.25 × its cap of 50); the general pools hold 30
# per endpoint: ordinary work leaves the pool first as it fills, decode-heavy work at the cap.
FILLING = [(0, "spec", "spec"), (12, "spec", "spec"), (13, "chunk", "spec"),
           (49, "chunk", "spec"), (50, "chunk", "chunk")]


@pytest.mark.parametrize(("batch", "ordinary", "decode_heavy"), FILLING)
def test_a_filling_spec_pool_sheds_ordinary_work_before_decode_heavy_work(
        batch: int, ordinary: str, decode_heavy: str) -> None:
    state = view(load={**{u: 30 for u in GENERAL_URLS}, "s1": batch, "c1": 29})
    assert _pool(LeverPolicy().decide(PolicyInput(features(), fleet(), state))) == ordinary
    assert _pool(LeverPolicy().decide(PolicyInput(DECODE_HEAVY, fleet(), state))) == decode_heavy


@pytest.mark.parametrize(("general", "spec", "pool"), [
    (3, 0, "general"), (4, 0, "spec"), (9, 5, "spec"), (8, 5, "general"), (0, 0, "general"),
])
def test_the_general_pools_must_be_busier_by_the_margin(general: int, spec: int,
                                                        pool: str) -> None:
    state = view(load={**{u: general for u in GENERAL_URLS}, "s1": spec})
    assert _pool(LeverPolicy().decide(PolicyInput(features(), fleet(), state))) == pool


def test_idle_spec_compares_with_the_least_loaded_open_general_pool() -> None:
    # general and radix are busy, chunk is idle: the default rule has a good place for it
    state = view(load={"g1": 9, "g2": 9, "r1": 9, "r2": 9})
    assert _pool(LeverPolicy().decide(PolicyInput(features(), fleet(), state))) == "chunk"
    # chunk is saturated: the least-loaded pool that can take it is at 9
    got = LeverPolicy().decide(PolicyInput(features(), fleet(state=saturated("c1")), state))
    assert got is not None and (got.pool, got.detail) == ("spec", "load=9.0/0.0,batch=0.0/12.5")


def test_idle_spec_can_be_turned_off_or_tuned() -> None:
    inp = PolicyInput(features(), fleet(), view(load=GENERAL_BUSY))
    assert _pool(LeverPolicy().decide(inp)) == "spec"
    off = PolicyConfig(rules=("pd", "spec", "prefix", "default"))
    assert _pool(LeverPolicy(off).decide(inp)) == "general"
    assert _pool(LeverPolicy(PolicyConfig(idle_spec_fraction=0.0)).decide(inp)) == "general"
    assert _pool(LeverPolicy(PolicyConfig(idle_spec_margin=6.0)).decide(inp)) == "general"
    half = LeverPolicy(PolicyConfig(idle_spec_fraction=0.5)).decide(
        PolicyInput(features(), fleet(), view(load={**GENERAL_BUSY, "s1": 1})))
    assert half is not None and half.detail == "load=5.0/1.0,batch=1.0/25.0"


def test_idle_spec_leaves_long_prefills_and_sessions_to_their_rules() -> None:
    no_pd = LeverPolicy(PolicyConfig(rules=("spec", "idle_spec", "prefix", "default")))
    long_ = PolicyInput(features(prompt_tokens=3000), fleet(), view(load=GENERAL_BUSY))
    assert _pool(no_pd.decide(long_)) == "general"
    # 3000 tokens, 10 of 30 blocks cached: 2000 uncached, short enough (no long match: 10 < 15)
    cached = PolicyInput(features(prompt_tokens=3000, blocks=30), fleet(),
                         view(load=GENERAL_BUSY, matched={"g1": 10}))
    assert _pool(no_pd.decide(cached)) == "spec"
    session = PolicyInput(features(session="abc"), fleet(),
                          view(load=GENERAL_BUSY, session_endpoint="r2"))
    got = LeverPolicy().decide(session)
    assert got is not None and (got.pool, got.reason) == ("radix", "session_follow_up")


def test_idle_spec_needs_a_known_ridge_and_a_general_pool() -> None:
    unknown = tuple(p.replaced(ridge_tokens=0.0) for p in fleet())
    got = LeverPolicy().decide(PolicyInput(features(), unknown, view(load=GENERAL_BUSY)))
    assert got is not None and (got.pool, got.reason) == ("general", "default")
    only_spec = fleet(drop=("general", "radix", "chunk"))
    got = LeverPolicy().decide(PolicyInput(features(), only_spec, view(load={"p1": 9})))
    assert got is not None and (got.pool, got.reason) == ("spec", "default")


def test_header_of_an_idle_spec_decision() -> None:
    pools = tuple(p.replaced(ridge_tokens=403.0, draft_tokens=4) if p.name == "spec" else p
                  for p in fleet())
    got = LeverPolicy().decide(PolicyInput(features(), pools,
                                           view(load={**GENERAL_BUSY, "s1": 1})))
    assert got is not None
    assert got.header_value() == ("pool=spec; lever=none; reason=idle_spec_capacity; "
                                  "load=5.0/1.0,batch=1.0/10.1")


# -- capacity: a long context to a pool with more KV room ---------------------------------------


def capacity_fleet(lever: str = HOST_KV_CACHE) -> tuple[PoolSnapshot, ...]:
    """The standard fleet plus a prefix-caching pool with a capacity lever ("roomy": c-1, c-2)."""
    roomy = PoolSnapshot("roomy", "vllm", "mixed", ("m",),
                         (ep("c-1", pool="roomy"), ep("c-2", pool="roomy")),
                         frozenset({PREFIX_CACHE, CHUNKED_PREFILL, lever}))
    return (*fleet(), roomy)


LONG = 10_000  # prompt tokens of a long context (≥ long_context_tokens, 8192)
CAPACITY_ON = PolicyConfig(rules=("capacity", *PolicyConfig().rules))


def test_the_capacity_rule_is_off_unless_listed() -> None:
    inp = PolicyInput(features(prompt_tokens=LONG), capacity_fleet(), view(prefix_share=0.9))
    got = LeverPolicy().decide(inp)
    assert got is not None and got.reason == "high_prefix_share"


def test_a_new_long_context_goes_to_the_capacity_pool() -> None:
    inp = PolicyInput(features(prompt_tokens=LONG), capacity_fleet(), view(load=BUSY))
    got = LeverPolicy(CAPACITY_ON).decide(inp)
    assert got is not None
    # every pool would recompute all of it (cost 10,000 × 1 against 10,000 × 5 on radix)
    assert (got.pool, got.lever, got.reason, got.detail) == (
        "roomy", HOST_KV_CACHE, "long_context", "in=10000,cost=0.20")


def test_an_fp8_pool_is_a_capacity_pool_too() -> None:
    inp = PolicyInput(features(prompt_tokens=LONG), capacity_fleet(FP8_KV_CACHE), view())
    got = LeverPolicy(CAPACITY_ON).decide(inp)
    assert got is not None and (got.pool, got.lever) == ("roomy", FP8_KV_CACHE)


def test_a_short_prompt_is_not_a_long_context() -> None:
    inp = PolicyInput(features(prompt_tokens=LONG - 2_000), capacity_fleet(),
                      view(prefix_share=0.9))
    got = LeverPolicy(CAPACITY_ON).decide(inp)
    assert got is not None and got.reason == "high_prefix_share"
    tuned = LeverPolicy(replace(CAPACITY_ON, long_context_tokens=8_000)).decide(inp)
    assert tuned is not None and (tuned.pool, tuned.reason) == ("roomy", "long_context")


def test_a_session_cached_in_the_capacity_pool_stays_there() -> None:
    # its history (90 of 100 blocks) on c-2, which is the busiest endpoint of the fleet
    inp = PolicyInput(features(prompt_tokens=LONG), capacity_fleet(),
                      view(matched={"c-2": 90}, load={"c-1": 9, "c-2": 9}))
    got = LeverPolicy(CAPACITY_ON).decide(inp)
    assert got is not None and (got.pool, got.reason) == ("roomy", "long_context")


def test_a_session_cached_elsewhere_stays_where_its_history_is() -> None:
    # history on r1: 1,000 uncached × 1 there against 10,000 × 1 in the capacity pool
    inp = PolicyInput(features(prompt_tokens=LONG), capacity_fleet(),
                      view(matched={"r1": 90}, prefix_share=0.9))
    got = LeverPolicy(CAPACITY_ON).decide(inp)
    assert got is not None and (got.pool, got.reason) == ("radix", "long_match")


@pytest.mark.parametrize(("roomy_load", "pool"), [
    (9, "roomy"),  # 10,000 × 10 against 10,000 × 5 on radix: 2.0 ≤ the ratio
    (10, "radix"),  # 10,000 × 11: 2.2 > 2: the prefix rule places it on its f
])
def test_a_much_busier_capacity_pool_is_passed_over(roomy_load: int, pool: str) -> None:
    load = {"r1": 4, "r2": 4, "c-1": roomy_load, "c-2": roomy_load}
    inp = PolicyInput(features(prompt_tokens=LONG), capacity_fleet(),
                      view(load=load, prefix_share=0.9))
    assert _pool(LeverPolicy(CAPACITY_ON).decide(inp)) == pool


def test_the_cost_ratio_comes_from_config_and_a_refusal_names_no_fallback() -> None:
    load = {"r1": 4, "r2": 4, "c-1": 10, "c-2": 10}
    inp = PolicyInput(features(prompt_tokens=LONG), capacity_fleet(),
                      view(load=load, prefix_share=0.9))
    passed = LeverPolicy(CAPACITY_ON).decide(inp)
    assert passed is not None and passed.reason == "high_prefix_share"  # no capacity>...
    tuned = LeverPolicy(replace(CAPACITY_ON, capacity_cost_ratio=3.0)).decide(inp)
    assert tuned is not None and tuned.pool == "roomy"


def test_a_fleet_without_capacity_pools_is_not_touched() -> None:
    inp = PolicyInput(features(prompt_tokens=LONG), fleet(), view(prefix_share=0.9))
    got = LeverPolicy(CAPACITY_ON).decide(inp)
    assert got is not None and got.reason == "high_prefix_share"
