"""The lever policy: which pool's levers relax the wall this request is about to hit.

An ordered table of :class:`Rule` s, tried in order; the first rule that fires *and* has a pool
able to take the request decides. Each rule names the lever it aims for, a predicate over the
request and the fleet (:class:`PolicyInput`), the pools that have the lever in preference
order, an optional admission limit, and the reason it gives. :data:`DEFAULT_RULES` holds
``capacity`` (off unless the fleet file lists it), ``pd``, ``spec``, ``idle_spec``, ``prefix``
and ``default``; :class:`PolicyConfig` holds the thresholds (units in brackets) and the rule
order, overridable in the fleet file under ``routing.policy``.

Invariants: a rule only takes a pool that serves the model, has a healthy endpoint (a pair:
both sides) and is not saturated; "a pool with lever L" means L is in ``PoolSnapshot.offered``.
A rule that fires but places nothing is named in the decision taken after it
(``rule>fallback_...``) unless it only offers spare room. A model with one pool gets it
(``only_pool``); a model no healthy pool serves gets None. Stateless and pure.

See docs/routing.md#the-lever-policy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from routing.cache_cost import best_match, cache_costs, uncached_tokens
from routing.decision import (
    DEFAULT,
    FALLBACK_NEAR_RIDGE,
    FALLBACK_SATURATED,
    FALLBACK_UNHEALTHY,
    HIGH_PREFIX_SHARE,
    IDLE_SPEC_CAPACITY,
    LONG_CONTEXT,
    LONG_MATCH,
    LONG_UNCACHED_UNDER_LOAD,
    LOW_LOAD_DECODE_HEAVY,
    NO_LEVER,
    ONLY_POOL,
    SESSION_FOLLOW_UP,
    RouteDecision,
    fallback_reason,
)
from routing.features import RequestFeatures
from routing.formulas import spec_batch_limit
from routing.load import endpoint_load, pool_load, pool_saturated
from routing.native_value import NativeValue
from routing.snapshots import (
    CHUNKED_PREFILL,
    DECODE,
    FP8_KV_CACHE,
    HOST_KV_CACHE,
    MIXED,
    PD_DISAGGREGATION,
    PREFILL,
    PREFIX_CACHE,
    SPECULATIVE,
    EndpointSnapshot,
    PoolSnapshot,
)
from routing.state.protocol import StateView

POOL_LOAD_SCALE = 1.0
"""[requests] The load scale of the cache cost that orders prefix-caching pools: every request
on an endpoint counts as one queued (the replica scorer's is :data:`routing.cache_cost.LOAD_SCALE`;
why they differ: docs/routing.md#the-rules)."""


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """The policy's thresholds (units in brackets) and the rule order (names; absent = off)."""

    long_prompt_tokens: int = 2048  # [tokens] uncached prompt that counts as long
    busy_load_per_endpoint: float = 4.0  # [requests per healthy endpoint] "under load"
    high_prefix_share: float = 0.5  # [fraction] prefix share f that counts as high
    long_match_blocks: int = 8  # [blocks] a match this long counts as long
    long_match_fraction: float = 0.5  # [fraction of the prompt's blocks] ... or this long
    decode_heavy_ratio: float = 2.0  # [output tokens per prompt token] decode-heavy
    spec_max_ridge_fraction: float = 0.5  # [fraction of ridge_tokens] cap on the verify batch
    idle_spec_fraction: float = 0.25  # [fraction of the spec cap] ordinary work's batch room
    idle_spec_margin: float = 4.0  # [requests per healthy endpoint] general load over spec's
    saturated_queue_per_endpoint: float = 8.0  # [waiting requests per healthy endpoint]
    long_context_tokens: int = 8192  # [tokens] a prompt this long counts as a long context
    capacity_cost_ratio: float = 2.0  # [×] a capacity pool's cost over the others' it may have
    rules: tuple[str, ...] = ("pd", "spec", "idle_spec", "prefix", "default")


class PolicyInput(NativeValue):
    """What the policy decides over: the request, every pool, and the router state's view.
    ``memo``: measures the rules share within one decision, with the configuration they were
    computed under (computed once, on first use; not a field: no part of equality or repr)."""

    FIELDS = ("features", "pools", "view")
    __slots__ = (*FIELDS, "memo")

    def __init__(self, features: RequestFeatures, pools: tuple[PoolSnapshot, ...],
                 view: StateView,
                 memo: dict[str, tuple[PolicyConfig, str | None]] | None = None) -> None:
        self.features: Final = features
        self.pools: Final = pools
        self.view: Final = view
        self.memo: Final[dict[str, tuple[PolicyConfig, str | None]]] = \
            {} if memo is None else memo


class Target(NativeValue):
    """A place a rule can send the request: a pool (and, for a prefill pool, its decode pool)."""

    FIELDS = ("pool", "lever", "decode")
    __slots__ = FIELDS

    def __init__(self, pool: PoolSnapshot, lever: str, decode: PoolSnapshot | None = None) -> None:
        self.pool: Final = pool
        self.lever: Final = lever
        self.decode: Final = decode


Predicate = Callable[[PolicyInput, PolicyConfig], bool]
Targets = Callable[[PolicyInput, PolicyConfig], tuple[Target, ...]]
Reason = Callable[[PolicyInput, PolicyConfig], str]
Detail = Callable[[PolicyInput, PolicyConfig, Target], str]
Admits = Callable[[Target, PolicyInput, PolicyConfig], bool]


def _always(*_: object) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class Rule:
    """One row of the table. ``when``: does the request call for ``lever``. ``targets``: the
    pools with the lever serving the model, preferred first, whatever their health. ``admits``:
    a lever-specific limit on a healthy, unsaturated target; when it refuses them all the
    fallback is named ``refusal``. ``reason``: a name from :data:`routing.decision.REASONS`;
    ``detail``: the numbers behind it (no ``;``). ``names_miss``: when the rule fires but cannot
    place the request, the decision taken after it names it (``rule>fallback``); False for a
    rule that only offers spare room, whose refusal is the normal case."""

    name: str
    lever: str
    when: Predicate
    targets: Targets
    reason: Reason
    detail: Detail
    admits: Admits = _always
    refusal: str = FALLBACK_SATURATED
    names_miss: bool = True


# --- measures over the fleet --------------------------------------------------------------


def _serving(inp: PolicyInput, role: str, lever: str | None = None) -> list[PoolSnapshot]:
    return [p for p in inp.pools if p.role == role and p.serves(inp.features.model)
            and (lever is None or lever in p.offered)]


def _least_loaded(pools: Sequence[PoolSnapshot], view: StateView) -> list[PoolSnapshot]:
    return sorted(pools, key=lambda p: pool_load(p, view.load))  # stable: ties keep fleet order


def _decode_of(pool: PoolSnapshot, inp: PolicyInput) -> PoolSnapshot | None:
    for other in inp.pools:
        if other.name == pool.pair and other.role == DECODE and other.serves(inp.features.model):
            return other
    return None


def _pairs(inp: PolicyInput) -> list[Target]:
    pairs = [Target(p, PD_DISAGGREGATION, _decode_of(p, inp))
             for p in _least_loaded(_serving(inp, PREFILL), inp.view)]
    return [t for t in pairs if t.decode is not None]


def _sides(t: Target) -> tuple[PoolSnapshot, ...]:
    return (t.pool,) if t.decode is None else (t.pool, t.decode)


def _healthy(t: Target) -> bool:
    return all(side.healthy_endpoints for side in _sides(t))


def _saturated(t: Target, cfg: PolicyConfig) -> bool:
    return any(pool_saturated(side, cfg.saturated_queue_per_endpoint) for side in _sides(t))


def _busy(inp: PolicyInput) -> float:
    """Requests per healthy endpoint over the model's mixed pools (0 when there are none)."""
    endpoints = [e for p in _serving(inp, MIXED) for e in p.healthy_endpoints]
    if not endpoints:
        return 0.0
    return sum(endpoint_load(e, inp.view.load) for e in endpoints) / len(endpoints)


def _uncached(inp: PolicyInput) -> int:
    """Prompt tokens left to prefill on the endpoint (serving the model) with the longest match."""
    serving = [e for p in inp.pools if p.serves(inp.features.model) for e in p.endpoints]
    return uncached_tokens(inp.features, best_match(serving, inp.features, inp.view))


def _caching(pool: PoolSnapshot, endpoints: Sequence[EndpointSnapshot]
             ) -> Sequence[EndpointSnapshot]:
    """Those of ``endpoints`` whose engine runs prefix caching. Callers on the request path
    test ``pool.lacking`` first: it is empty while every engine runs what its pool declares."""
    lacking = pool.lacking.get(PREFIX_CACHE)
    return endpoints if not lacking else [e for e in endpoints if e.url not in lacking]


def _prefix_match(inp: PolicyInput, pool: PoolSnapshot | None = None) -> int:
    pools = [pool] if pool is not None else _serving(inp, MIXED, PREFIX_CACHE)
    endpoints = (e for p in pools
                 for e in (_caching(p, p.endpoints) if p.lacking else p.endpoints))
    return best_match(endpoints, inp.features, inp.view)


def _long_match(inp: PolicyInput, cfg: PolicyConfig) -> bool:
    match, blocks = _prefix_match(inp), len(inp.features.block_hashes)
    return match > 0 and (match >= cfg.long_match_blocks
                          or match >= cfg.long_match_fraction * blocks)


def _high_share(inp: PolicyInput, cfg: PolicyConfig) -> bool:
    share = inp.view.prefix_share
    return share is not None and share >= cfg.high_prefix_share


def _spec_limit(pool: PoolSnapshot, cfg: PolicyConfig) -> float:
    """The decode batch [sequences per endpoint] speculation may run at: the batch whose
    verify tokens, (K + 1) per sequence, reach a fraction of the ridge [tokens per step]."""
    return spec_batch_limit(pool.ridge_tokens, pool.draft_tokens, cfg.spec_max_ridge_fraction)


# --- the default rules ----------------------------------------------------------------------


def _pd_when(inp: PolicyInput, cfg: PolicyConfig) -> bool:
    return (_uncached(inp) >= cfg.long_prompt_tokens
            and _busy(inp) >= cfg.busy_load_per_endpoint)


def _pd_targets(inp: PolicyInput, cfg: PolicyConfig) -> tuple[Target, ...]:
    chunked = [p for p in _serving(inp, MIXED, CHUNKED_PREFILL) if SPECULATIVE not in p.offered]
    chunked = _least_loaded(chunked, inp.view)
    return (*_pairs(inp), *(Target(p, CHUNKED_PREFILL) for p in chunked))


def _pd_detail(inp: PolicyInput, cfg: PolicyConfig, t: Target) -> str:
    return f"uncached={_uncached(inp)},load={_busy(inp):.1f}"


def _cheapest(inp: PolicyInput, pool: PoolSnapshot) -> float:
    """The lowest ``cache_cost`` over the pool's healthy endpoints (inf when none)."""
    healthy = (_caching(pool, pool.healthy_endpoints) if pool.lacking
               else pool.healthy_endpoints)
    return min(cache_costs(healthy, inp.features, inp.view, POOL_LOAD_SCALE),
               default=math.inf)


def _session_pool(inp: PolicyInput) -> PoolSnapshot | None:
    """The prefix-caching pool serving the model whose caching endpoint the request's session
    last used (None without a session, or when that endpoint is elsewhere)."""
    url = inp.view.session_endpoint
    if url is None or inp.features.session is None:
        return None
    for pool in _serving(inp, MIXED, PREFIX_CACHE):
        if url not in pool.lacking.get(PREFIX_CACHE, ()) and any(
                e.url == url for e in pool.endpoints):
            return pool
    return None


def _prefix_evidence(inp: PolicyInput, cfg: PolicyConfig) -> str | None:
    """The prefix rule's reason: the strongest evidence the request brings, computed once per
    decision (docs/routing.md#the-rules)."""
    known = inp.memo.get("prefix")
    if known is not None and known[0] is cfg:
        return known[1]
    evidence = (LONG_MATCH if _long_match(inp, cfg)
                else SESSION_FOLLOW_UP if _session_pool(inp) is not None
                else HIGH_PREFIX_SHARE if _high_share(inp, cfg) else None)
    inp.memo["prefix"] = (cfg, evidence)
    return evidence


def _by_cost(inp: PolicyInput, pools: Sequence[PoolSnapshot]) -> list[PoolSnapshot]:
    return sorted(pools, key=lambda p: _cheapest(inp, p))  # stable: ties keep fleet order


def _prefix_targets(inp: PolicyInput, cfg: PolicyConfig) -> tuple[Target, ...]:
    evidence = _prefix_evidence(inp, cfg)
    pools = _serving(inp, MIXED, PREFIX_CACHE)
    if evidence == LONG_MATCH:
        return tuple(Target(p, PREFIX_CACHE) for p in _by_cost(inp, pools))
    general = _by_cost(inp, [p for p in pools if SPECULATIVE not in p.offered])
    home = _session_pool(inp) if evidence == SESSION_FOLLOW_UP else None
    ordered = [home, *(p for p in general if p is not home)] if home is not None else general
    return tuple(Target(p, PREFIX_CACHE) for p in ordered)


def _prefix_reason(inp: PolicyInput, cfg: PolicyConfig) -> str:
    return _prefix_evidence(inp, cfg) or HIGH_PREFIX_SHARE


def _prefix_detail(inp: PolicyInput, cfg: PolicyConfig, t: Target) -> str:
    share = inp.view.prefix_share
    f = "na" if share is None else f"{share:.2f}"
    detail = f"f={f},match={_prefix_match(inp, t.pool)}/{len(inp.features.block_hashes)}"
    if _prefix_evidence(inp, cfg) == SESSION_FOLLOW_UP:
        home = _session_pool(inp)
        detail += f",session={home.name if home is not None else 'na'}"
    exact = inp.view.exact_endpoints
    if exact and any(e.url in exact for e in t.pool.endpoints):
        detail += ",index=events"
    return detail


def _spec_when(inp: PolicyInput, cfg: PolicyConfig) -> bool:
    f = inp.features
    return f.expected_output_tokens >= cfg.decode_heavy_ratio * max(f.prompt_tokens, 1)


def _spec_targets(inp: PolicyInput, cfg: PolicyConfig) -> tuple[Target, ...]:
    pools = _least_loaded(_serving(inp, MIXED, SPECULATIVE), inp.view)
    return tuple(Target(p, SPECULATIVE) for p in pools)


def _spec_admits(t: Target, inp: PolicyInput, cfg: PolicyConfig) -> bool:
    return t.pool.ridge_tokens > 0 and pool_load(t.pool, inp.view.load) < _spec_limit(t.pool, cfg)


def _spec_detail(inp: PolicyInput, cfg: PolicyConfig, t: Target) -> str:
    f = inp.features
    batch, limit = pool_load(t.pool, inp.view.load), _spec_limit(t.pool, cfg)
    return f"out={f.expected_output_tokens},in={f.prompt_tokens},batch={batch:.1f}/{limit:.1f}"


def _idle_spec_when(inp: PolicyInput, cfg: PolicyConfig) -> bool:
    """An ordinary request, in a fleet with a speculative pool for the model: no cache
    evidence for another pool (a long match, a session's pool), and no long prefill (uncached
    tokens ≤ prompt tokens, so the short ones skip the match look-up)."""
    if not _serving(inp, MIXED, SPECULATIVE):
        return False
    if _prefix_evidence(inp, cfg) in (LONG_MATCH, SESSION_FOLLOW_UP):
        return False
    return (inp.features.prompt_tokens < cfg.long_prompt_tokens
            or _uncached(inp) < cfg.long_prompt_tokens)


def _general_load(inp: PolicyInput, cfg: PolicyConfig) -> float | None:
    """The lowest load [requests per healthy endpoint] of the general pools serving the model
    (mixed, without speculative decoding) that can take a request (healthy, not saturated);
    ``inf`` when none can; None when the model has no general pool."""
    general = [p for p in _serving(inp, MIXED) if SPECULATIVE not in p.offered]
    if not general:
        return None
    open_ = [p for p in general if p.healthy_endpoints
             and not pool_saturated(p, cfg.saturated_queue_per_endpoint)]
    return min((pool_load(p, inp.view.load) for p in open_), default=math.inf)


def _idle_room(pool: PoolSnapshot, cfg: PolicyConfig) -> float:
    """The decode batch [sequences per endpoint] below which the pool takes ordinary work:
    ``idle_spec_fraction`` of the spec rule's cap (0 for an unknown ridge)."""
    return cfg.idle_spec_fraction * _spec_limit(pool, cfg)


def _idle_spec_admits(t: Target, inp: PolicyInput, cfg: PolicyConfig) -> bool:
    general = _general_load(inp, cfg)
    batch = pool_load(t.pool, inp.view.load)
    return (general is not None and batch < _idle_room(t.pool, cfg)
            and general - batch >= cfg.idle_spec_margin)


def _idle_spec_targets(inp: PolicyInput, cfg: PolicyConfig) -> tuple[Target, ...]:
    pools = _least_loaded(_serving(inp, MIXED, SPECULATIVE), inp.view)
    return tuple(Target(p, NO_LEVER) for p in pools)


def _idle_spec_detail(inp: PolicyInput, cfg: PolicyConfig, t: Target) -> str:
    general = _general_load(inp, cfg)
    batch, room = pool_load(t.pool, inp.view.load), _idle_room(t.pool, cfg)
    load = "na" if general is None else f"{general:.1f}"
    return f"load={load}/{batch:.1f},batch={batch:.1f}/{room:.1f}"


CAPACITY_LEVERS = (HOST_KV_CACHE, FP8_KV_CACHE)
"""The capacity levers, in the order a decision names them when a pool offers both."""


def _capacity_lever(pool: PoolSnapshot) -> str | None:
    return next((lever for lever in CAPACITY_LEVERS if lever in pool.offered), None)


def _capacity_pools(inp: PolicyInput) -> list[PoolSnapshot]:
    """The model's mixed prefix-caching pools without speculation that offer a capacity lever."""
    return [p for p in _serving(inp, MIXED, PREFIX_CACHE)
            if SPECULATIVE not in p.offered and _capacity_lever(p) is not None]


def _capacity_when(inp: PolicyInput, cfg: PolicyConfig) -> bool:
    return inp.features.prompt_tokens >= cfg.long_context_tokens and bool(_capacity_pools(inp))


def _capacity_targets(inp: PolicyInput, cfg: PolicyConfig) -> tuple[Target, ...]:
    return tuple(Target(p, _capacity_lever(p) or NO_LEVER)
                 for p in _by_cost(inp, _capacity_pools(inp)))


def _cost_ratio(inp: PolicyInput, pool: PoolSnapshot) -> float:
    """``pool``'s cheapest cache cost ÷ the cheapest on the model's other prefix-caching
    pools (0 when there are none: nothing to weigh it against)."""
    others = [p for p in _serving(inp, MIXED, PREFIX_CACHE) if p.name != pool.name]
    elsewhere = min((_cheapest(inp, p) for p in others), default=math.inf)
    return _cheapest(inp, pool) / elsewhere if elsewhere < math.inf else 0.0


def _capacity_admits(t: Target, inp: PolicyInput, cfg: PolicyConfig) -> bool:
    return _cost_ratio(inp, t.pool) <= cfg.capacity_cost_ratio


def _capacity_detail(inp: PolicyInput, cfg: PolicyConfig, t: Target) -> str:
    ratio = _cost_ratio(inp, t.pool)
    shown = "na" if ratio == 0.0 else f"{ratio:.2f}"
    return f"in={inp.features.prompt_tokens},cost={shown}"


def _default_targets(inp: PolicyInput, cfg: PolicyConfig) -> tuple[Target, ...]:
    mixed = _serving(inp, MIXED)
    general = [p for p in mixed if SPECULATIVE not in p.offered] or mixed
    return tuple(Target(p, NO_LEVER) for p in _least_loaded(general, inp.view))


def _load_detail(inp: PolicyInput, cfg: PolicyConfig, t: Target) -> str:
    return f"load={pool_load(t.pool, inp.view.load):.1f}"


DEFAULT_RULES: tuple[Rule, ...] = (
    Rule("capacity", NO_LEVER, _capacity_when, _capacity_targets,
         lambda i, c: LONG_CONTEXT, _capacity_detail,
         admits=_capacity_admits, names_miss=False),
    Rule("pd", PD_DISAGGREGATION, _pd_when, _pd_targets,
         lambda i, c: LONG_UNCACHED_UNDER_LOAD, _pd_detail),
    Rule("prefix", PREFIX_CACHE, lambda i, c: _prefix_evidence(i, c) is not None,
         _prefix_targets, _prefix_reason, _prefix_detail),
    Rule("spec", SPECULATIVE, _spec_when, _spec_targets,
         lambda i, c: LOW_LOAD_DECODE_HEAVY, _spec_detail,
         admits=_spec_admits, refusal=FALLBACK_NEAR_RIDGE),
    Rule("idle_spec", NO_LEVER, _idle_spec_when, _idle_spec_targets,
         lambda i, c: IDLE_SPEC_CAPACITY, _idle_spec_detail,
         admits=_idle_spec_admits, names_miss=False),
    Rule("default", NO_LEVER, _always, _default_targets, lambda i, c: DEFAULT, _load_detail),
)


# --- the engine -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Placed:
    target: Target
    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class _Miss:
    reason: str
    detail: str


def routable(inp: PolicyInput) -> tuple[Target, ...]:
    """Every healthy place serving the model: mixed pools, and prefill pools whose pair is up.
    One pass over the pools finds the mixed ones and whether any prefill pool needs pairing
    (most fleets have none: it runs for every request)."""
    model, prefill = inp.features.model, False
    places: list[Target] = []
    for p in inp.pools:
        if p.role == MIXED:
            if p.healthy_endpoints and p.serves(model):
                places.append(Target(p, NO_LEVER))
        elif p.role == PREFILL:
            prefill = True
    if prefill:
        places += [t for t in _pairs(inp) if _healthy(t)]
    return tuple(places)


def _try(rule: Rule, inp: PolicyInput, cfg: PolicyConfig) -> _Placed | _Miss | None:
    """Place the request with ``rule``; a miss says why not; None when it has no pools at all."""
    targets = rule.targets(inp, cfg)
    if not targets:
        return None
    healthy = [t for t in targets if _healthy(t)]
    if not healthy:
        return _Miss(fallback_reason(rule.name, FALLBACK_UNHEALTHY),
                     rule.detail(inp, cfg, targets[0]))
    unsaturated = [t for t in healthy if not _saturated(t, cfg)]
    if not unsaturated:
        return _Miss(fallback_reason(rule.name, FALLBACK_SATURATED),
                     rule.detail(inp, cfg, healthy[0]))
    admitted = [t for t in unsaturated if rule.admits(t, inp, cfg)]
    if not admitted:
        return _Miss(fallback_reason(rule.name, rule.refusal),
                     rule.detail(inp, cfg, unsaturated[0]))
    return _Placed(admitted[0], rule.reason(inp, cfg), rule.detail(inp, cfg, admitted[0]))


def _decision(t: Target, reason: str, detail: str) -> RouteDecision:
    decode = t.decode.name if t.decode is not None else None
    return RouteDecision(t.pool.name, decode, t.lever, reason, detail)


def _after_miss(placed: _Placed, miss: _Miss | None) -> RouteDecision:
    if miss is None:
        return _decision(placed.target, placed.reason, placed.detail)
    detail = ",".join(d for d in (miss.detail, placed.detail) if d)
    return _decision(placed.target, miss.reason, detail)


def _last_resort(places: Sequence[Target], inp: PolicyInput, cfg: PolicyConfig,
                 miss: _Miss | None) -> RouteDecision:
    """No rule placed it: the least-loaded unsaturated place, else the least-loaded one."""
    t = min(places, key=lambda p: (_saturated(p, cfg), pool_load(p.pool, inp.view.load)))
    fallback = FALLBACK_SATURATED if _saturated(t, cfg) else DEFAULT
    placed = _Placed(t, fallback, _load_detail(inp, cfg, t))
    return _after_miss(placed, miss)


class LeverPolicy:
    """Features + pools → :class:`RouteDecision` by the rule table
    (docs/routing.md#the-lever-policy).

    ``table``: the rules available by name (default :data:`DEFAULT_RULES`); ``config.rules``
    picks which run and in what order. Stateless: safe to share.
    """

    def __init__(self, config: PolicyConfig = PolicyConfig(),
                 table: Sequence[Rule] = DEFAULT_RULES) -> None:
        by_name = {r.name: r for r in table}
        unknown = [n for n in config.rules if n not in by_name]
        if unknown:
            raise ValueError(f"unknown policy rules {unknown}; known: {sorted(by_name)}")
        if len(set(config.rules)) != len(config.rules):
            raise ValueError(f"policy rules listed twice: {list(config.rules)}")
        self.config = config
        self.rules = tuple(by_name[n] for n in config.rules)

    def decide(self, inp: PolicyInput) -> RouteDecision | None:
        """The decision, or None when no healthy pool serves the model."""
        cfg = self.config
        places = routable(inp)
        if not places:
            return None
        if len(places) == 1:
            return _decision(places[0], ONLY_POOL, _load_detail(inp, cfg, places[0]))
        miss: _Miss | None = None
        for rule in self.rules:
            if not rule.when(inp, cfg):
                continue
            outcome = _try(rule, inp, cfg)
            if isinstance(outcome, _Placed):
                return _after_miss(outcome, miss)
            if outcome is not None and miss is None and rule.names_miss:
                miss = outcome
        return _last_resort(places, inp, cfg, miss)
