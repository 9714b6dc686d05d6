"""The endpoint record: everything the registry holds about one endpoint, mutable, one per URL.

Times are on the registry's clock (seconds, monotonic). Invariants: ``request_failures`` (the
circuit breaker's count) is above 0 whenever the breaker is not closed, that is whenever
``open_until`` is set; ``known`` once a health verdict was reached (``healthy`` is no longer a
default); ``left_at`` is set from the moment the endpoint leaves its pool (it drains: no longer
probed, its request outcomes ignored). Only the registry (:mod:`backends.registry.endpoints`)
and the breaker's transitions (:mod:`backends.registry.breaker`) change a record; readers get a
frozen :class:`~backends.registry.status.EndpointStatus`. See docs/architecture.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from backends.engines.dialects import EngineDialect
from backends.engines.facts import LoadedAdapters
from backends.registry.lever_check import LeverCheck
from routing.snapshots import EngineMetrics


@dataclass(slots=True)
class EndpointRecord:
    """The registry's state of the endpoint ``url`` of ``pool``."""

    url: str
    pool: str
    dialect: EngineDialect
    healthy: bool = False
    metrics: EngineMetrics = field(default_factory=EngineMetrics)
    metrics_at: float | None = None
    last_error: str | None = None
    consecutive_failures: int = 0
    last_poll_at: float | None = None
    failed_at: float = -math.inf
    request_failures: int = 0  # the breaker's count; > 0 whenever the breaker is not closed
    open_until: float | None = None  # end of the breaker's open period; None: closed
    open_s: float | None = None  # length of that period [s]
    known: bool = False  # a health verdict was reached (healthy is no longer a default)
    down_at: float = -math.inf  # when it last became unhealthy
    facts_due: bool = True  # read its engine's facts when it is next healthy
    facts_at: float = -math.inf  # when its facts were last read
    lever_check: LeverCheck = field(default_factory=LeverCheck)
    adapters: LoadedAdapters = field(default_factory=LoadedAdapters)
    left_at: float | None = None  # when it left its pool (draining); None: in its pool
