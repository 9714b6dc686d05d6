"""The plugin catalog: plugin types by name, and building a :class:`Scheduler` from a
:class:`SchedulerConfig`.

The tables map a plugin type's name to its class; a class's keyword arguments are its
parameters (documented in its module). Each :func:`build_scheduler` call creates fresh
instances, so a plugin with state (round-robin's last pick, random_top's generator) has one
instance per scheduler.

Instances: a name used in the configuration's filters, scorers or picker is looked up in its
``plugins`` (:class:`PluginSpec`: instance name → type + parameters), else taken as a type
name with default parameters. A picker whose class takes a ``seed`` gets the configuration's
``seed`` unless its parameters set one. An unknown name or type, a plugin of the wrong kind, an
unknown parameter, a parameter value the plugin refuses, a scorer without a weight or with a
weight that is not a positive finite number raises :class:`SchedulerConfigError` naming the
problem; the fleet file loader runs :func:`validate` at start-up (:mod:`config.fleet`).
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from routing.scheduler.framework import (
    Filter,
    Picker,
    PluginSpec,
    Scheduler,
    SchedulerConfig,
    Scorer,
)
from routing.scheduler.plugins.adapter_affinity import AdapterAffinity
from routing.scheduler.plugins.cache_aware import CacheAware
from routing.scheduler.plugins.footprint import Footprint
from routing.scheduler.plugins.healthy import Healthy
from routing.scheduler.plugins.least_load import LeastLoad
from routing.scheduler.plugins.max_score import MaxScore
from routing.scheduler.plugins.not_saturated import NotSaturated
from routing.scheduler.plugins.prefix_match import PrefixMatch
from routing.scheduler.plugins.random_top import RandomTop
from routing.scheduler.plugins.round_robin import RoundRobin
from routing.scheduler.plugins.session_affinity import SessionAffinity

FILTERS: Mapping[str, Callable[..., Filter]] = MappingProxyType({
    "adapter_affinity": AdapterAffinity,
    "healthy": Healthy,
    "not_saturated": NotSaturated,
})
SCORERS: Mapping[str, Callable[..., Scorer]] = MappingProxyType({
    "cache_aware": CacheAware,
    "footprint": Footprint,
    "least_load": LeastLoad,
    "prefix_match": PrefixMatch,
    "session_affinity": SessionAffinity,
})
PICKERS: Mapping[str, Callable[..., Picker]] = MappingProxyType({
    "max_score": MaxScore,
    "random_top": RandomTop,
    "round_robin": RoundRobin,
})
KINDS: Mapping[str, Mapping[str, Callable[..., Any]]] = MappingProxyType(
    {"filter": FILTERS, "scorer": SCORERS, "picker": PICKERS})


class SchedulerConfigError(ValueError):
    """A scheduler configuration the catalog cannot build (the message says why)."""


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


def parameters_of(factory: Callable[..., Any]) -> tuple[str, ...]:
    """The keyword parameters a plugin class takes."""
    return tuple(inspect.signature(factory).parameters)


def _instance(kind: str, name: str, config: SchedulerConfig) -> Any:
    """A fresh instance of the ``kind`` plugin called ``name`` in ``config``."""
    table = KINDS[kind]
    spec = next((p for p in config.plugins if p.name == name), None) or PluginSpec(name, name)
    if spec.type not in table:
        known = sorted({*table, *(p.name for p in config.plugins if p.type in table)})
        raise SchedulerConfigError(f"unknown {kind} {name!r}; known: {', '.join(known)}")
    factory = table[spec.type]
    params = dict(spec.parameters)
    accepted = parameters_of(factory)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise SchedulerConfigError(
            f"{kind} {name!r} ({spec.type}): unknown parameter(s) {unknown}; "
            f"known: {', '.join(accepted) or 'none'}")
    if kind == "picker" and "seed" in accepted:
        params.setdefault("seed", config.seed)
    try:
        return factory(**params)
    except (TypeError, ValueError) as exc:
        raise SchedulerConfigError(f"{kind} {name!r} ({spec.type}): {exc}") from exc


def _check_specs(config: SchedulerConfig) -> None:
    names = [p.name for p in config.plugins]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SchedulerConfigError(f"plugin instance(s) declared twice: {twice}")
    for spec in config.plugins:
        if not any(spec.type in table for table in KINDS.values()):
            known = sorted(n for table in KINDS.values() for n in table)
            raise SchedulerConfigError(
                f"plugin {spec.name!r}: unknown type {spec.type!r}; known: {', '.join(known)}")


def build_scheduler(config: SchedulerConfig,
                    clock: Callable[[], int] = time.perf_counter_ns) -> Scheduler:
    """A scheduler with fresh plugin instances for ``config`` (raises
    :class:`SchedulerConfigError` when it cannot be built)."""
    _check_specs(config)
    seen: set[str] = set()
    scorers = []
    for name, weight in config.scorers:
        if name in seen:
            raise SchedulerConfigError(f"scorer {name!r} listed twice")
        seen.add(name)
        scorers.append((name, _instance("scorer", name, config), check_weight(name, weight)))
    return Scheduler(
        filters=[(n, _instance("filter", n, config)) for n in config.filters],
        scorers=scorers,
        picker=(config.picker, _instance("picker", config.picker, config)),
        clock=clock,
    )


def validate(config: SchedulerConfig) -> None:
    """Raise :class:`SchedulerConfigError` unless ``config`` can be built."""
    build_scheduler(config)
