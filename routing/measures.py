"""Load and cache measures over one snapshot, shared by the lever policy and the scheduler.

Pure functions of an :class:`~routing.types.EndpointSnapshot` / :class:`~routing.types.PoolSnapshot`
and the router's :class:`~routing.state.StateView`. Units: requests, tokens, blocks.

- ``endpoint_load`` [requests] = gateway in-flight + engine running + engine waiting. The gateway
  count is the larger of the shared state's count (every gateway replica) and the snapshot's
  own (this replica only, a subset of the shared one), so neither is counted twice. The
  engine's figures lag by one metrics poll, so a request may be counted by both the gateway
  and the engine for up to one poll: the measure ranks endpoints, it is not an exact census
  (the convention of :attr:`EndpointSnapshot.load`).
- ``pool_load`` [requests per endpoint] = mean ``endpoint_load`` over the healthy endpoints.
- ``uncached_tokens`` [tokens] = prompt tokens − matched blocks × tokens per block, ≥ 0.
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
    """Requests on ``ep``: gateway in-flight (shared view or local, the larger) + engine queued."""
    gateway = max(view.load_of(ep.url).requests, ep.in_flight)
    return gateway + ep.metrics.queued


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


def pool_saturated(pool: PoolSnapshot, max_waiting: float) -> bool:
    """True when the pool has healthy endpoints and every one has ≥ ``max_waiting`` waiting."""
    healthy = pool.healthy_endpoints
    return bool(healthy) and all((ep.metrics.waiting or 0.0) >= max_waiting for ep in healthy)
