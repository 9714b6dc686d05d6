"""Fleet changes: what applying a new fleet, or a pool's new endpoint set, changes (pure).

:class:`FleetChanges` names the pools added, removed and changed (other than in their
endpoints) and the endpoints added or drained, by URL; it is false when nothing changed. The
functions diff an old and a new fleet: a pool's endpoints as the fleet file writes them
(:func:`written`), whether a pool changed other than in its endpoints (:func:`reconfigured`),
and the endpoints a pool should have once a fleet is applied (:func:`wanted_urls`). The registry
applies the result — endpoints join, drain and go
(:meth:`~backends.registry.endpoints.EndpointRegistry.apply_fleet`,
:meth:`~backends.registry.endpoints.EndpointRegistry.set_endpoints`). See
docs/architecture.md, "Endpoints and fleets that change".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from backends.registry.resolver import DNS
from config.pools import Pool


@dataclass(frozen=True, slots=True)
class FleetChanges:
    """What applying a fleet (or a new endpoint set) changed: pools by name, endpoints by URL
    (``drained``: left their pool and draining now)."""

    pools_added: tuple[str, ...] = ()
    pools_removed: tuple[str, ...] = ()
    pools_changed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    drained: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return any((self.pools_added, self.pools_removed, self.pools_changed, self.added,
                    self.drained))


def reconfigured(before: Pool, after: Pool) -> bool:
    """Whether a pool changed other than in its endpoints."""
    return before.model_copy(update={"endpoints": after.endpoints}) != after


def written(pool: Pool) -> tuple[str, ...]:
    """A pool's endpoints as the fleet file writes them; none for a ``resolve: dns`` pool
    (its addresses come with the first look-up)."""
    return () if pool.resolve == DNS else tuple(pool.endpoint_urls())


def wanted_urls(pool: Pool, before: Pool | None, resolved: Mapping[str, Sequence[str]],
                current: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The endpoints ``pool`` should have once applied (``before``: the pool of that name in
    the fleet applied last; ``current``: every pool's endpoints now): the file's — for a
    ``resolve: dns`` pool, ``resolved[name]`` when given, else the addresses it has if its
    names did not change, else none until the next look-up."""
    if pool.resolve != DNS:
        return tuple(pool.endpoint_urls())
    if pool.name in resolved:
        return tuple(resolved[pool.name])
    same = before is not None and before.resolve == DNS and \
        before.endpoint_urls() == pool.endpoint_urls()
    return current[pool.name] if same else ()
