"""Load and cache measures over one snapshot, shared by the lever policy and the scheduler.

Pure functions of an :class:`~routing.types.EndpointSnapshot` / :class:`~routing.types.PoolSnapshot`
and the router's :class:`~routing.state.StateView`. Units: requests, tokens, blocks.

- ``endpoint_load`` [requests] = max(gateway in-flight, engine running + engine waiting). The
  gateway count is the larger of the shared state's count (every gateway replica) and the
  snapshot's own (this replica only, a subset of the shared one). A request sent through the
  gateway is in both the gateway's count and, once the engine has it, the engine's, so the two
  are not added: the gateway's count is live and covers what the engine has not reported yet
  (its figures lag by one metrics poll); the engine's covers requests that reached it some
  other way (a gateway that does not share this state, a direct client). Each request is
  counted once.
- ``pool_load`` [requests per endpoint] = mean ``endpoint_load`` over the healthy endpoints.
- ``uncached_tokens`` [tokens] = prompt tokens − matched blocks × tokens per block, ≥ 0.
- ``cache_cost`` [tokens × requests] = max(uncached tokens on the endpoint, 1) × (load + 1):
  the prefill work a request adds on an endpoint scaled by the queue it joins (the
  ``cache_aware`` scorer's cost, :mod:`routing.scheduler.plugins.cache_aware`).
- ``pool_saturated``: every healthy endpoint's engine waiting queue [requests] is at least
  ``max_waiting`` (the engine has no batch room left anywhere in the pool).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from routing.features import RequestFeatures
from routing.state import StateView
from routing.types import EndpointSnapshot, PoolSnapshot

MIXED = "mixed"
PREFILL = "prefill"
DECODE = "decode"


def endpoint_load(ep: EndpointSnapshot, view: StateView) -> float:
    """Requests on ``ep``: the largest of the shared view's in-flight, this gateway's own and
    the engine's running + waiting."""
    return max(view.load_of(ep.url).requests, ep.in_flight, ep.metrics.queued)


def pool_load(pool: PoolSnapshot, view: StateView) -> float:
    """Mean requests per healthy endpoint; ``inf`` when no endpoint is healthy."""
    healthy = pool.healthy_endpoints
    if not healthy:
        return math.inf
    return sum(endpoint_load(ep, view) for ep in healthy) / len(healthy)


def matched_blocks(url: str, features: RequestFeatures, view: StateView) -> int:
    """Leading prompt blocks ``url`` probably holds, capped at the prompt's block count."""
    return min(max(view.matched_blocks.get(url, 0), 0), len(features.block_hashes))


def best_match(endpoints: Iterable[EndpointSnapshot], features: RequestFeatures,
               view: StateView) -> int:
    """The longest match [blocks] on any of ``endpoints`` (0 when none)."""
    return max((matched_blocks(ep.url, features, view) for ep in endpoints), default=0)


def uncached_tokens(features: RequestFeatures, matched: int) -> int:
    """Prompt tokens an endpoint holding ``matched`` leading blocks still has to prefill (≥ 0)."""
    return max(features.prompt_tokens - matched * features.block_tokens, 0)


def cache_cost(ep: EndpointSnapshot, features: RequestFeatures, view: StateView) -> float:
    """max(uncached tokens on ``ep``, 1) × (``endpoint_load`` + 1) [tokens × requests], ≥ 1."""
    uncached = max(uncached_tokens(features, matched_blocks(ep.url, features, view)), 1)
    return uncached * (endpoint_load(ep, view) + 1.0)


def pool_saturated(pool: PoolSnapshot, max_waiting: float) -> bool:
    """True when the pool has healthy endpoints and every one has ≥ ``max_waiting`` waiting."""
    healthy = pool.healthy_endpoints
    return bool(healthy) and all((ep.metrics.waiting or 0.0) >= max_waiting for ep in healthy)
