"""A route decision: which pool (or prefill/decode pair), by which lever, and why.

``reason`` is safe as a Prometheus label: either one name from :data:`REASONS`, or, when the
rule that first wanted the request could not take it, ``"<rule>><fallback>"`` with the rule's
name and a name from :data:`FALLBACKS` (``prefix>fallback_saturated``) — a bounded set for a
given rule table, enumerated by :func:`reason_values`. ``lever`` is a name from
:data:`routing.snapshots.LEVERS` or :data:`NO_LEVER`. ``detail`` carries the numbers behind the
decision (``f=0.82,match=14/16``) for the response header only, never for a label.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from routing.native_value import NativeValue
from routing.snapshots import LEVERS

NO_LEVER = "none"

LONG_UNCACHED_UNDER_LOAD = "long_uncached_under_load"
HIGH_PREFIX_SHARE = "high_prefix_share"
LONG_MATCH = "long_match"
SESSION_FOLLOW_UP = "session_follow_up"
LOW_LOAD_DECODE_HEAVY = "low_load_decode_heavy"
IDLE_SPEC_CAPACITY = "idle_spec_capacity"
LONG_CONTEXT = "long_context"
DEFAULT = "default"
ONLY_POOL = "only_pool"
FALLBACK_SATURATED = "fallback_saturated"
FALLBACK_UNHEALTHY = "fallback_unhealthy"
FALLBACK_NEAR_RIDGE = "fallback_near_ridge"

FALLBACKS = frozenset({FALLBACK_SATURATED, FALLBACK_UNHEALTHY, FALLBACK_NEAR_RIDGE})
REASONS = frozenset({
    LONG_UNCACHED_UNDER_LOAD, HIGH_PREFIX_SHARE, LONG_MATCH, SESSION_FOLLOW_UP,
    LOW_LOAD_DECODE_HEAVY, IDLE_SPEC_CAPACITY, LONG_CONTEXT, DEFAULT,
    ONLY_POOL, *FALLBACKS,
})


def fallback_reason(rule: str, fallback: str) -> str:
    """The reason label of a decision taken after ``rule`` could not be served (``fallback``)."""
    return f"{rule}>{fallback}"


def reason_values(rule_names: Iterable[str]) -> frozenset[str]:
    """Every reason label a policy with these rules can produce (for pre-registering labels)."""
    return REASONS | {fallback_reason(r, f) for r in rule_names for f in FALLBACKS}


def lever_values() -> frozenset[str]:
    """Every lever label a decision can carry."""
    return LEVERS | {NO_LEVER}


class RouteDecision(NativeValue):
    """Where one request goes. ``decode_pool``: for a prefill/decode pair, the decode side."""

    FIELDS = ("pool", "decode_pool", "lever", "reason", "detail")
    __slots__ = FIELDS

    def __init__(self, pool: str, decode_pool: str | None, lever: str, reason: str,
                 detail: str = "") -> None:
        self.pool: Final = pool
        self.decode_pool: Final = decode_pool
        self.lever: Final = lever
        self.reason: Final = reason
        self.detail: Final = detail

    def header_value(self) -> str:
        """``pool=radix; lever=prefix_cache; reason=high_prefix_share; f=0.82,match=14/16``."""
        pools = self.pool if self.decode_pool is None else \
            f"{self.pool}; decode={self.decode_pool}"
        if self.detail:  # one string built, not a list of them joined: once per response
            return f"pool={pools}; lever={self.lever}; reason={self.reason}; {self.detail}"
        return f"pool={pools}; lever={self.lever}; reason={self.reason}"
