"""What the gateway keys by the fleet's pools and endpoints, kept true while they change.

The registry's pools and endpoints change at runtime (a fleet reload, a ``resolve: dns``
pool's look-ups). Two parts of the gateway follow them here:

- :class:`FleetRegistryView`: the registry's snapshot as one fleet's dispatcher sees it,
  without the pools its fleet lacks; one identity test on the request path while the two
  agree.
- :class:`LiveEfficiency`: the MFU/MBU accounting (:mod:`gateway.telemetry.efficiency`),
  rebuilt for the endpoints there are after every change of their facts by URL, its collector
  replacing the previous one (its window and counters start again).

See docs/gateway.md#views-that-follow-the-fleet.
"""

from __future__ import annotations

from prometheus_client.registry import Collector

from backends.registry.endpoints import EndpointRegistry
from config.fleet import Fleet
from gateway.telemetry.efficiency import (
    EfficiencyCollector,
    EndpointFacts,
    TokenLedger,
    endpoint_facts,
)
from gateway.telemetry.fleet_gauges import StateReadout
from gateway.telemetry.prometheus import Telemetry
from routing.snapshots import PoolSnapshot


class FleetRegistryView:
    """The dispatcher's :class:`~gateway.request.dispatch.RegistryView` for ``fleet``: the
    registry's snapshot restricted to the fleet's pools; request outcomes go to the registry as
    they are."""

    __slots__ = ("_registry", "_names", "_seen", "_mine", "mark_failed", "mark_succeeded")

    def __init__(self, registry: EndpointRegistry, fleet: Fleet) -> None:
        self._registry = registry
        self._names = frozenset(p.name for p in fleet.pools)
        self._seen: tuple[PoolSnapshot, ...] | None = None
        self._mine: tuple[PoolSnapshot, ...] = ()
        self.mark_failed = registry.mark_failed
        self.mark_succeeded = registry.mark_succeeded

    def snapshot(self) -> tuple[PoolSnapshot, ...]:
        pools = self._registry.snapshot()
        if pools is not self._seen:
            names = self._names
            self._mine = pools if all(p.name in names for p in pools) else \
                tuple(p for p in pools if p.name in names)
            self._seen = pools
        return self._mine


def registry_facts(registry: EndpointRegistry) -> dict[str, EndpointFacts]:
    """The facts of every endpoint of the registry's pools now, by URL (pools without model
    or hardware facts left out, silently: start-up said so once)."""
    priced = [p.model_copy(update={"endpoints": list(registry.pool_urls(p.name))})
              for p in registry.pools if p.model is not None and p.hardware is not None]
    return endpoint_facts(Fleet.model_construct(pools=priced))


class LiveEfficiency:
    """Keeps the telemetry's MFU/MBU accounting keyed by the registry's endpoints (module
    docstring). Built after :meth:`Telemetry.bind_fleet`; rebinds at once, then after every
    change of the endpoint set it is told of (:meth:`rebind`)."""

    def __init__(self, telemetry: Telemetry, registry: EndpointRegistry, fleet: Fleet,
                 state: StateReadout | None = None) -> None:
        self._telemetry, self._registry = telemetry, registry
        self._collector: Collector = telemetry.bind_fleet(fleet, registry.snapshot, state)
        self.rebind()

    def rebind(self) -> None:
        """A new accounting for the endpoints there are now, unless their facts are the same."""
        old = self._telemetry.ledger
        facts = registry_facts(self._registry)
        if old is None or dict(old.facts) == facts:
            return
        ledger = TokenLedger(facts, window_s=old.window_s, clock=old.now)
        collector = EfficiencyCollector(ledger, self._registry.snapshot)
        metrics = self._telemetry.metrics_registry
        metrics.unregister(self._collector)
        metrics.register(collector)
        self._telemetry.ledger, self._collector = ledger, collector
