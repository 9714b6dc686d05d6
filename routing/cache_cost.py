"""How much of a request's prompt an endpoint probably holds, and what serving it there costs.

Pure functions of the request's features and the router state's view. Units: blocks, tokens,
requests.

- :func:`matched_blocks` [blocks]: the leading prompt blocks the prefix index says the endpoint
  holds, capped at the prompt's; :func:`best_match`: the longest over some endpoints.
- :func:`uncached_tokens` [tokens] = prompt tokens − matched blocks × tokens per block, ≥ 0.
- :func:`cache_cost` [tokens × requests] = max(uncached tokens + reload tokens, 1) × (load ÷
  ``load_scale`` + 1): load is :func:`routing.load.endpoint_load`, reload tokens price the
  host-tier part of the match from the engines' KV events (``StateView.reload_tokens``); the
  floor of 1 because an engine holding the whole prompt still computes its last token. It is
  the ``cache_aware`` scorer's cost (at :data:`LOAD_SCALE`) and the lever policy's order of
  prefix-caching pools (at ``routing.policy.POOL_LOAD_SCALE``).

See docs/routing.md#load-and-cache-cost.
"""

from __future__ import annotations

from collections.abc import Iterable

from routing.features import RequestFeatures
from routing.snapshots import EndpointSnapshot
from routing.state.protocol import StateView

LOAD_SCALE = 2.0
"""[requests] Requests on an engine that count as one queued ahead of a new one in
:func:`cache_cost`: an engine batches what it runs, so they slow a new request more than they
hold it back (why 2: docs/routing.md#load-and-cache-cost)."""


def matched_blocks(url: str, features: RequestFeatures, view: StateView) -> int:
    """Leading prompt blocks ``url`` probably holds, capped at the prompt's block count."""
    return min(max(view.matched_blocks.get(url, 0), 0), len(features.block_hashes))


def best_match(endpoints: Iterable[EndpointSnapshot], features: RequestFeatures,
               view: StateView) -> int:
    """The longest match [blocks] on any of ``endpoints`` (0 when none): the largest
    :func:`matched_blocks`, capped once (the cap is monotone) rather than per endpoint — it
    runs for every request."""
    matched, longest = view.matched_blocks, 0
    for ep in endpoints:  # max() over a generator, written out: half the cost
        held = matched.get(ep.url, 0)
        if held > longest:
            longest = held
    return min(longest, len(features.block_hashes))


def uncached_tokens(features: RequestFeatures, matched: int) -> int:
    """Prompt tokens an endpoint holding ``matched`` leading blocks still has to prefill (≥ 0)."""
    return max(features.prompt_tokens - matched * features.block_tokens, 0)


def cache_cost(ep: EndpointSnapshot, features: RequestFeatures, view: StateView,
               load_scale: float = LOAD_SCALE) -> float:
    """max(uncached tokens on ``ep`` + its reload tokens, 1) × (``endpoint_load`` ÷
    ``load_scale`` + 1) [tokens × requests], ≥ 1."""
    return cache_costs((ep,), features, view, load_scale)[0]


def cache_costs(endpoints: Iterable[EndpointSnapshot], features: RequestFeatures,
                view: StateView, load_scale: float = LOAD_SCALE) -> list[float]:
    """:func:`cache_cost` of each of ``endpoints``, in their order: :func:`matched_blocks`,
    :func:`uncached_tokens` and :func:`routing.load.endpoint_load` written out in one loop
    (it runs for every candidate of every request)."""
    blocks, prompt, per_block = (len(features.block_hashes), features.prompt_tokens,
                                 features.block_tokens)
    matched, load, reload = view.matched_blocks, view.load, view.reload_tokens
    out: list[float] = []
    scale = 1.0 / load_scale
    for ep in endpoints:
        url = ep.url
        held = matched.get(url, 0)
        cached = (blocks if held > blocks else held if held > 0 else 0) * per_block
        uncached = float(prompt - cached)
        if reload:
            uncached += reload.get(url, 0.0)
        counted = load.get(url)
        requests = float(counted.requests) if counted is not None else 0.0
        queued = ep.queued
        out.append((uncached if uncached > 1 else 1.0) * (
            (requests if requests > queued else queued) * scale + 1.0))
    return out
