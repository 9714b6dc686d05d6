"""Pool snapshots: the levers the engines really run (``offered``, ``lacking``)."""

from __future__ import annotations

from routing.snapshots import (
    CHUNKED_PREFILL,
    PREFIX_CACHE,
    SPECULATIVE,
    EndpointSnapshot,
    PoolSnapshot,
)
from tests.unit.routing.scheduler.snapshots import ep

LEVERS = frozenset({PREFIX_CACHE, SPECULATIVE})


def endpoint(url: str, *missing: str, healthy: bool = True) -> EndpointSnapshot:
    return ep(url, healthy=healthy).replaced(missing_levers=frozenset(missing))


def pool(*endpoints: EndpointSnapshot) -> PoolSnapshot:
    return PoolSnapshot("p", "vllm", "mixed", ("m",), endpoints, LEVERS)


def test_engines_that_run_every_declared_lever() -> None:
    p = pool(endpoint("a"), endpoint("b"))
    assert p.offered == LEVERS and p.lacking == {}


def test_a_lever_some_healthy_endpoint_runs_is_still_offered() -> None:
    p = pool(endpoint("a", SPECULATIVE), endpoint("b"))
    assert p.offered == LEVERS
    assert p.lacking == {SPECULATIVE: frozenset({"a"})}


def test_a_lever_no_healthy_endpoint_runs_is_not_offered() -> None:
    p = pool(endpoint("a", SPECULATIVE), endpoint("b", SPECULATIVE, PREFIX_CACHE),
             endpoint("c", healthy=False))  # c would run it, but it is down
    assert p.offered == {PREFIX_CACHE}
    assert p.lacking == {SPECULATIVE: frozenset({"a", "b"}), PREFIX_CACHE: frozenset({"b"})}


def test_with_no_healthy_endpoint_the_declared_levers_stand() -> None:
    """The pool is out for its health then; the policy's fallback reason should say so."""
    p = pool(endpoint("a", SPECULATIVE, healthy=False))
    assert p.offered == LEVERS and p.healthy_endpoints == ()


def test_a_lever_the_pool_does_not_declare_is_ignored() -> None:
    p = pool(endpoint("a", CHUNKED_PREFILL))
    assert p.offered == LEVERS and p.lacking == {}


def test_a_replaced_snapshot_recomputes_its_views() -> None:
    p = pool(endpoint("a"))
    q = p.replaced(endpoints=(endpoint("a", PREFIX_CACHE),))
    assert q.offered == {SPECULATIVE} and p.offered == LEVERS
