"""How much of a request's prompt an endpoint probably holds, and what serving it there costs.

Pure functions of the request's features and the router state's view. Units: blocks, tokens,
requests.

- ``matched_blocks`` [blocks]: the leading prompt blocks the prefix index says the endpoint
  holds, capped at the prompt's block count; ``best_match``: the longest over some endpoints.
- ``uncached_tokens`` [tokens] = prompt tokens − matched blocks × tokens per block, ≥ 0.
- ``cache_cost`` [tokens × requests] = max(uncached tokens on the endpoint + reload tokens, 1)
  × (load ÷ ``load_scale`` + 1), where reload tokens (``StateView.reload_tokens``, from the
  engines' KV events) price the matched blocks held only in a host tier at a fraction of
  recomputing them, and load [requests] is :func:`routing.load.endpoint_load`: the prefill
  work a request adds on an endpoint, scaled by the requests it shares the engine with,
  ``load_scale`` of them (:data:`LOAD_SCALE`, 2) counting as one queued ahead of it — an
  engine batches what it runs, so they slow a new request more than they hold it back.
  It is the ``cache_aware`` scorer's cost
  (:mod:`routing.scheduler.plugins.cache_aware`) and the lever policy's measure for choosing
  among prefix-caching pools (at its own scale, ``routing.policy.POOL_LOAD_SCALE``). Uncached
  tokens are floored at 1 (an engine holding the whole prompt still computes the last prompt
  token), so the cost is ≥ 1.
"""

from __future__ import annotations

from collections.abc import Iterable

from routing.features import RequestFeatures
from routing.snapshots import EndpointSnapshot
from routing.state.protocol import StateView

LOAD_SCALE = 2.0
"""[requests] Requests on an engine that count as one queued ahead of a new one in
:func:`cache_cost`. Measured on the capacity benchmark's long sessions
(``docs/benchmarks/capacity.md``): at 1 (every request in flight counted as queued) the load
term sent follow-ups away from their cached history to an idle replica that recomputed it; at
2 none left, and requests per replica stayed within 1.08 of the mean; at 4 none left either,
but the replicas drifted apart (max/mean 1.18)."""


def matched_blocks(url: str, features: RequestFeatures, view: StateView) -> int:
    """Leading prompt blocks ``url`` probably holds, capped at the prompt's block count."""
    return min(max(view.matched_blocks.get(url, 0), 0), len(features.block_hashes))


def best_match(endpoints: Iterable[EndpointSnapshot], features: RequestFeatures,
               view: StateView) -> int:
    """The longest match [blocks] on any of ``endpoints`` (0 when none): the largest
    :func:`matched_blocks`, capped once (the cap is monotone) rather than per endpoint — it
    runs for every request."""
    get, longest = view.matched_blocks.get, 0
    for ep in endpoints:  # max() over a generator, written out: half the cost
        held = get(ep.url, 0)
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
    return cache_costs((ep,), features, view, load_scale)[ep.url]


def cache_costs(endpoints: Iterable[EndpointSnapshot], features: RequestFeatures,
                view: StateView, load_scale: float = LOAD_SCALE) -> dict[str, float]:
    """:func:`cache_cost` of each of ``endpoints``, by URL: :func:`matched_blocks`,
    :func:`uncached_tokens` and :func:`routing.load.endpoint_load` written out in one loop
    (it runs for every candidate of every request)."""
    blocks, prompt, per_block = (len(features.block_hashes), features.prompt_tokens,
                                 features.block_tokens)
    matched, load, reload = view.matched_blocks, view.load, view.reload_tokens
    out, scale = {}, 1.0 / load_scale
    for ep in endpoints:
        url = ep.url
        held = matched.get(url, 0)
        cached = (blocks if held > blocks else held if held > 0 else 0) * per_block
        uncached = float(prompt - cached)
        if reload:
            uncached += reload.get(url, 0.0)
        counted = load.get(url)
        requests = counted.requests if counted is not None else 0
        queued = ep.queued
        out[url] = (uncached if uncached > 1 else 1) * (
            (requests if requests > queued else queued) * scale + 1.0)
    return out
