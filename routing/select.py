"""Select-and-reserve in one step: the replica choice a state can make atomically.

Many gateways sharing one state must not all read "endpoint X is idle" and all send to X
(herding). The cure is to pick the replica and count the request on it in ONE atomic step
of the state (:meth:`routing.state.RouterState.select_and_reserve`): the in-memory state does
it in Python without awaiting; the Redis state in one Lua script. Both use the scoring
defined here, which is the replica scheduler's (:mod:`routing.scheduler`) restricted to what
the state can compute atomically:

- candidates: the pool's endpoints that passed the scheduler's filters (filters read only the
  frozen snapshot, so the caller runs them), each with ``in_flight`` (this gateway's own count,
  requests) and ``queued`` (the engine's running + waiting, requests);
- load_e [requests] = max(state's in-flight requests on e, in_flight_e, queued_e)
  (:func:`routing.measures.endpoint_load`);
- scorers (each in [0, 1], weighted, summed, like :class:`routing.scheduler.Scheduler`):
  ``cache_aware`` = min cost / cost_e with cost_e = max(prompt − matched_e × block_tokens, 1)
  × (load_e + 1) [tokens × requests]; ``least_load`` = 1 − load_e / max load (all 1 when every
  load is 0); ``prefix_match`` = matched_e / blocks (0 for a prompt without a full block);
  ``session_affinity`` = 1 on the session's endpoint, else 0;
- picker ``max_score``: the first candidate (in pool order) whose total is the maximum, up to
  a relative tolerance of 1e-9 (:func:`routing.scheduler.framework.top`).

:data:`ATOMIC_SCORERS` and :data:`ATOMIC_PICKERS` name what is supported; a pool configured
otherwise goes the read → schedule → reserve way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from routing.state import Reservation, StateView

CACHE_AWARE, LEAST_LOAD, PREFIX_MATCH, SESSION_AFFINITY = (
    "cache_aware", "least_load", "prefix_match", "session_affinity")
ATOMIC_SCORERS = frozenset({CACHE_AWARE, LEAST_LOAD, PREFIX_MATCH, SESSION_AFFINITY})
ATOMIC_PICKERS = frozenset({"max_score"})
REL_TOL = 1e-9  # ties: totals equal up to this relative tolerance (as framework.top)


@dataclass(frozen=True, slots=True)
class Candidate:
    """An endpoint that may take the request: ``in_flight`` this gateway's own requests on it,
    ``queued`` the engine's running + waiting requests (last poll)."""

    url: str
    in_flight: int = 0
    queued: float = 0.0


@dataclass(frozen=True, slots=True)
class Group:
    """One side of a request (the endpoint, or a prefill/decode pair's one side): the
    candidates in pool order and the scorer weights (name → weight > 0)."""

    candidates: tuple[Candidate, ...]
    weights: Mapping[str, float] = field(default_factory=lambda: {CACHE_AWARE: 1.0})


@dataclass(frozen=True, slots=True)
class SelectRequest:
    """Everything one atomic select-and-reserve needs.

    ``endpoints``: the URLs whose loads the returned view carries (every endpoint serving the
    model). ``groups``: one per side to choose (one, or two for prefill then decode).
    ``prompt_tokens`` and ``block_tokens`` feed ``cache_aware``; ``tokens`` is what each
    reservation counts (prompt + expected output).
    """

    model: str
    block_hashes: Sequence[int]
    session: str | None
    endpoints: Sequence[str]
    groups: tuple[Group, ...]
    prompt_tokens: int
    block_tokens: int
    tokens: int


@dataclass(frozen=True, slots=True)
class Selection:
    """The chosen URL per group, a reservation per group (same order), and the view the
    choice was made on (before the reservations)."""

    endpoints: tuple[str, ...]
    reservations: tuple[Reservation, ...]
    view: StateView


def load_of(c: Candidate, view: StateView) -> float:
    """load_e [requests] = max(shared in-flight, own in-flight, engine queued)."""
    return max(view.load_of(c.url).requests, c.in_flight, c.queued)


def _cache_aware(req: SelectRequest, group: Group, view: StateView) -> dict[str, float]:
    blocks = len(req.block_hashes)
    costs = {}
    for c in group.candidates:
        matched = min(max(view.matched_blocks.get(c.url, 0), 0), blocks)
        uncached = max(req.prompt_tokens - matched * req.block_tokens, 1)
        costs[c.url] = uncached * (load_of(c, view) + 1.0)
    cheapest = min(costs.values(), default=1.0)
    return {url: cheapest / cost for url, cost in costs.items()}


def _least_load(req: SelectRequest, group: Group, view: StateView) -> dict[str, float]:
    loads = {c.url: load_of(c, view) for c in group.candidates}
    top = max(loads.values(), default=0.0)
    return {url: 1.0 if top <= 0 else 1.0 - load / top for url, load in loads.items()}


def _prefix_match(req: SelectRequest, group: Group, view: StateView) -> dict[str, float]:
    blocks = len(req.block_hashes)
    return {c.url: min(view.matched_blocks.get(c.url, 0), blocks) / blocks if blocks else 0.0
            for c in group.candidates}


def _session(req: SelectRequest, group: Group, view: StateView) -> dict[str, float]:
    target = view.session_endpoint if req.session is not None else None
    return {c.url: 1.0 if c.url == target else 0.0 for c in group.candidates}


SCORE_FUNCTIONS = {CACHE_AWARE: _cache_aware, LEAST_LOAD: _least_load,
                   PREFIX_MATCH: _prefix_match, SESSION_AFFINITY: _session}


def pick(req: SelectRequest, group: Group, view: StateView) -> str:
    """The URL ``group``'s weighted scorers and the max_score picker choose on ``view``."""
    totals = {c.url: 0.0 for c in group.candidates}
    for name, weight in group.weights.items():
        for url, score in SCORE_FUNCTIONS[name](req, group, view).items():
            totals[url] += weight * (0.0 if math.isnan(score) else min(max(score, 0.0), 1.0))
    best = max(totals.values())
    return next(url for url, total in totals.items()
                if math.isclose(total, best, rel_tol=REL_TOL, abs_tol=1e-12))
