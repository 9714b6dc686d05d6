"""The circuit breaker of every endpoint: its configuration, its states and its transitions.

It catches an engine whose health probe passes while its real requests fail. It counts
consecutive request failures; a request that succeeded resets the count. *Closed*:
``failures`` consecutive failures open it. *Open* for ``open_s`` seconds: the endpoint is
unhealthy whatever the probes say (a passive failure dated at the end of the period, so only a
probe started after it counts). *Half-open*, once the period is over: the endpoint is routable
again when such a probe succeeds, and the first request outcome decides: a success closes the
breaker (count 0, open time back to ``open_s``), a failure reopens it at once for twice the
last open time, at most ``max_open_s``. A success reported while it is open (a request sent
before it opened) changes nothing. Times in seconds, on the registry's clock. The registry
(:mod:`backends.registry.endpoints`) calls the transitions; see docs/architecture.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum

from backends.registry.operator_log import LOGGER, redacted
from backends.registry.record import EndpointRecord

log = logging.getLogger(LOGGER)


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    """The circuit breaker of every endpoint (rules in the module docstring).

    ``failures``: consecutive failed requests that open it (>= 1); ``open_s``: the first open
    time [s]; ``max_open_s``: the cap of the open time, doubled at each reopening [s] (it caps
    the first open time too).
    """

    failures: int = 3
    open_s: float = 5.0
    max_open_s: float = 60.0

    def __post_init__(self) -> None:
        if self.failures < 1:
            raise ValueError("breaker failures must be at least 1")
        if not (self.open_s > 0 and self.max_open_s > 0):
            raise ValueError("breaker open times must be positive")

    def next_open_s(self, last_open_s: float | None) -> float:
        """The open time after ``last_open_s`` (None: the breaker was closed) [s]."""
        return min(self.max_open_s, self.open_s if last_open_s is None else 2 * last_open_s)


class CircuitState(Enum):
    """Where an endpoint's circuit breaker stands (rules in the module docstring)."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


def circuit(ep: EndpointRecord, now: float) -> CircuitState:
    """Where ``ep``'s breaker stands at ``now``."""
    if ep.open_until is None:
        return CircuitState.CLOSED
    return CircuitState.OPEN if now < ep.open_until else CircuitState.HALF_OPEN


def trips(config: BreakerConfig, ep: EndpointRecord, now: float) -> bool:
    """Whether the failure just counted opens the breaker: the count reached ``failures``
    while closed, or the breaker was half-open (a failure while open changes nothing)."""
    if ep.open_until is None:
        return ep.request_failures >= config.failures
    return now >= ep.open_until


def open_breaker(config: BreakerConfig, ep: EndpointRecord, now: float, reason: str) -> None:
    """Open ``ep``'s breaker at ``now`` for the next open time (``reason``: the last failure)."""
    ep.open_s = config.next_open_s(ep.open_s)
    ep.open_until = now + ep.open_s
    ep.failed_at = ep.open_until  # only a probe started after the period brings it back
    log.warning("endpoint %s (pool %s): circuit breaker open for %.1f s after %d "
                "consecutive failed requests (last: %s)",
                redacted(ep.url), ep.pool, ep.open_s, ep.request_failures,
                redacted(reason))


def close_breaker(ep: EndpointRecord) -> None:
    """Close ``ep``'s breaker: count 0, the next open time back to the first."""
    ep.request_failures, ep.open_until, ep.open_s = 0, None, None
    log.info("endpoint %s (pool %s): circuit breaker closed, a request succeeded",
             redacted(ep.url), ep.pool)
