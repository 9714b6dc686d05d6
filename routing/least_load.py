"""Least-load endpoint choice: the first routing, before the lever policy.

Algorithm: among healthy endpoints of the pools that serve the requested model (role ``mixed``
only: prefill/decode pools are reached through their pair), pick the one with the smallest
load = gateway in-flight requests + engine running + engine waiting. Ties go to the endpoint
listed first, which keeps the choice deterministic. Parameters: ``exclude``, URLs already
tried for this request (a retry goes elsewhere).
"""

from __future__ import annotations

from collections.abc import Iterable

from routing.types import EndpointSnapshot, PoolSnapshot


def candidates(pools: Iterable[PoolSnapshot], model: str) -> list[EndpointSnapshot]:
    """Healthy endpoints of the mixed pools serving ``model``."""
    return [
        ep
        for pool in pools
        if pool.role == "mixed" and pool.serves(model)
        for ep in pool.healthy_endpoints
    ]


def pick_least_loaded(
    endpoints: Iterable[EndpointSnapshot], exclude: frozenset[str] = frozenset()
) -> EndpointSnapshot | None:
    """The least-loaded endpoint not in ``exclude``, or None when there is none."""
    best: EndpointSnapshot | None = None
    for ep in endpoints:
        if ep.url in exclude:
            continue
        if best is None or ep.load < best.load:
            best = ep
    return best
