"""Plugin names → factories, and building a :class:`Scheduler` from a :class:`SchedulerConfig`.

The tables are read-only mappings; each :func:`build_scheduler` call creates fresh plugin
instances, so a plugin with state (round-robin's last pick, random_top's generator) has one
instance per scheduler. An unknown name, a scorer without a weight, or a weight that is not a
positive finite number raises :class:`SchedulerConfigError` naming the problem; the fleet file
loader checks the same names at start-up (:mod:`backends.config`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType

from routing.scheduler.framework import Filter, Picker, Scheduler, SchedulerConfig, Scorer
from routing.scheduler.plugins.cache_aware import CacheAware
from routing.scheduler.plugins.healthy import Healthy
from routing.scheduler.plugins.least_load import LeastLoad
from routing.scheduler.plugins.max_score import MaxScore
from routing.scheduler.plugins.not_saturated import NotSaturated
from routing.scheduler.plugins.prefix_match import PrefixMatch
from routing.scheduler.plugins.random_top import RandomTop
from routing.scheduler.plugins.round_robin import RoundRobin
from routing.scheduler.plugins.session_affinity import SessionAffinity

FILTERS: Mapping[str, Callable[[], Filter]] = MappingProxyType({
    "healthy": Healthy,
    "not_saturated": NotSaturated,
})
SCORERS: Mapping[str, Callable[[], Scorer]] = MappingProxyType({
    "cache_aware": CacheAware,
    "least_load": LeastLoad,
    "prefix_match": PrefixMatch,
    "session_affinity": SessionAffinity,
})
# pickers are built with the scheduler's seed (those without randomness ignore it)
PICKERS: Mapping[str, Callable[[int], Picker]] = MappingProxyType({
    "max_score": lambda seed: MaxScore(),
    "random_top": RandomTop,
    "round_robin": lambda seed: RoundRobin(),
})


class SchedulerConfigError(ValueError):
    """A scheduler configuration naming an unknown plugin or lacking a usable weight."""


def check_name(table: Mapping[str, object], kind: str, name: str) -> None:
    """Raise :class:`SchedulerConfigError` unless ``name`` is in ``table`` (of ``kind``)."""
    if name not in table:
        raise SchedulerConfigError(f"unknown {kind} {name!r}; known: {', '.join(sorted(table))}")


def check_weight(name: str, weight: object) -> float:
    """``weight`` as a float, or :class:`SchedulerConfigError` when missing or not > 0."""
    if weight is None:
        raise SchedulerConfigError(f"scorer {name!r} has no weight")
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise SchedulerConfigError(f"scorer {name!r}: weight must be a number, got {weight!r}")
    if not math.isfinite(weight) or weight <= 0:
        raise SchedulerConfigError(f"scorer {name!r}: weight must be > 0, got {weight!r}")
    return float(weight)


def validate(config: SchedulerConfig) -> None:
    """Raise :class:`SchedulerConfigError` unless every name is known and every weight usable."""
    for name in config.filters:
        check_name(FILTERS, "filter", name)
    seen: set[str] = set()
    for name, weight in config.scorers:
        check_name(SCORERS, "scorer", name)
        check_weight(name, weight)
        if name in seen:
            raise SchedulerConfigError(f"scorer {name!r} listed twice")
        seen.add(name)
    check_name(PICKERS, "picker", config.picker)


def build_scheduler(config: SchedulerConfig,
                    clock: Callable[[], int] = time.perf_counter_ns) -> Scheduler:
    """A scheduler with fresh plugin instances for ``config``."""
    validate(config)
    return Scheduler(
        filters=[(n, FILTERS[n]()) for n in config.filters],
        scorers=[(n, SCORERS[n](), float(w)) for n, w in config.scorers],
        picker=(config.picker, PICKERS[config.picker](config.seed)),
        clock=clock,
    )
