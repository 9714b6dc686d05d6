"""An endpoint's status, frozen: as one poll finds it (:class:`PollResult`, what the poller
gives the registry) and as the registry reports it (:class:`EndpointStatus`, for admin pages,
gauges and tests).

Both are values: never updated, read again for news. Times are on the registry's clock
(seconds, monotonic); a status's ``circuit`` is where the breaker stood when it was read
(:func:`status_of`). See docs/architecture.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.registry.breaker import CircuitState, circuit
from backends.registry.lever_check import LeverCheck
from backends.registry.record import EndpointRecord
from routing.snapshots import EngineMetrics


@dataclass(frozen=True, slots=True)
class PollResult:
    """What one poll of one endpoint found. ``started_at`` is on the registry's clock."""

    started_at: float
    healthy: bool
    metrics: EngineMetrics | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class EndpointStatus:
    """Everything the registry knows about one endpoint (for admin pages and tests).

    ``consecutive_failures`` counts failed probes and requests since the last good probe;
    ``request_failures`` counts failed requests since the last successful one (the breaker's
    count); ``circuit_open_until``: when the breaker's open period ends (None: closed);
    ``lever_check``: its engine's facts against the pool's levers (empty until read).
    """

    url: str
    pool: str
    healthy: bool
    metrics: EngineMetrics
    last_error: str | None
    consecutive_failures: int
    last_poll_at: float | None
    metrics_at: float | None
    circuit: CircuitState = CircuitState.CLOSED
    request_failures: int = 0
    circuit_open_until: float | None = None
    lever_check: LeverCheck = LeverCheck()


def status_of(ep: EndpointRecord, now: float) -> EndpointStatus:
    """``ep``'s status at ``now``."""
    return EndpointStatus(
        url=ep.url,
        pool=ep.pool,
        healthy=ep.healthy,
        metrics=ep.metrics,
        last_error=ep.last_error,
        consecutive_failures=ep.consecutive_failures,
        last_poll_at=ep.last_poll_at,
        metrics_at=ep.metrics_at,
        circuit=circuit(ep, now),
        request_failures=ep.request_failures,
        circuit_open_until=ep.open_until,
        lever_check=ep.lever_check,
    )
