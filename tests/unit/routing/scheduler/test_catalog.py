"""The plugin catalog: names, named instances with parameters, and refused configurations."""

from __future__ import annotations

import math
from typing import Any, cast

import pytest

from routing.scheduler.catalog import (
    FILTERS,
    KINDS,
    PICKERS,
    SCORERS,
    SchedulerConfigError,
    build_scheduler,
    parameters_of,
)
from routing.scheduler.framework import PluginSpec, SchedulerConfig
from tests.unit.routing.scheduler.snapshots import ctx, ep


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (SchedulerConfig(filters=("healthy", "fresh")), "unknown filter 'fresh'"),
        (SchedulerConfig(scorers=(("cache_awareness", 1.0),)), "unknown scorer 'cache_awareness'"),
        (SchedulerConfig(picker="best"), "unknown picker 'best'"),
        (SchedulerConfig(scorers=(("least_load", cast(Any, None)),)),
         "scorer 'least_load' has no weight"),
        (SchedulerConfig(scorers=(("least_load", 0.0),)), "weight must be > 0"),
        (SchedulerConfig(scorers=(("least_load", -1.0),)), "weight must be > 0"),
        (SchedulerConfig(scorers=(("least_load", math.nan),)), "weight must be > 0"),
        (SchedulerConfig(scorers=(("least_load", cast(Any, "1")),)), "must be a number"),
        (SchedulerConfig(scorers=(("least_load", cast(Any, True)),)), "must be a number"),
        (SchedulerConfig(scorers=(("least_load", 1.0), ("least_load", 2.0))), "listed twice"),
    ],
)
def test_bad_configs_are_refused(config: SchedulerConfig, message: str) -> None:
    with pytest.raises(SchedulerConfigError, match=message):
        build_scheduler(config)


def test_unknown_name_message_lists_the_known_ones() -> None:
    with pytest.raises(SchedulerConfigError) as info:
        build_scheduler(SchedulerConfig(picker="best"))
    assert "max_score, random_top, round_robin" in str(info.value)


def test_catalog_names() -> None:
    assert set(FILTERS) == {"adapter_affinity", "healthy", "not_saturated"}
    assert set(SCORERS) == {"cache_aware", "footprint", "least_load", "prefix_match",
                            "session_affinity"}
    assert set(PICKERS) == {"max_score", "random_top", "round_robin"}
    with pytest.raises(TypeError):
        cast(Any, SCORERS)["x"] = SCORERS["least_load"]  # read-only table


PARAMETERS = {"not_saturated": ("max_waiting",), "cache_aware": ("load_scale",),
              "footprint": ("threshold", "slack", "by"), "random_top": ("seed",)}


@pytest.mark.parametrize(("kind", "name"), [(k, n) for k, t in KINDS.items() for n in t])
def test_every_plugins_parameters_are_read_from_its_constructor(kind: str, name: str) -> None:
    """Compiled too (``make native``): mypyc gives a constructor a signature only when its
    defaults are literals, and the catalog needs it."""
    assert parameters_of(KINDS[kind][name]) == PARAMETERS.get(name, ())




def test_a_named_instance_takes_its_parameters() -> None:
    roomy = PluginSpec("roomy", "not_saturated", {"max_waiting": 3})
    scheduler = build_scheduler(SchedulerConfig(filters=("healthy", "roomy"), scorers=(),
                                                plugins=(roomy,)))
    endpoints = [ep("a", waiting=5), ep("b", waiting=3), ep("c", waiting=0)]
    # a queues more than 3: filtered out; b and c pass; no scorer: they tie, the first wins
    assert scheduler.schedule(ctx(endpoints)).endpoint == endpoints[1]
    strict = build_scheduler(SchedulerConfig(filters=("healthy", "not_saturated"), scorers=()))
    assert strict.schedule(ctx(endpoints)).endpoint == endpoints[2]  # the default: 0 waiting


def test_instances_are_timed_under_their_own_names() -> None:
    roomy = PluginSpec("roomy", "not_saturated", {"max_waiting": 1})
    scheduler = build_scheduler(SchedulerConfig(filters=("roomy",), plugins=(roomy,)))
    assert scheduler.plugin_names == ("roomy", "cache_aware", "footprint", "max_score")
    result = scheduler.schedule(ctx([ep("a")]))
    assert [t.name for t in result.timings] == ["roomy", "cache_aware", "footprint", "max_score"]


def test_a_picker_gets_the_config_seed_unless_its_parameters_set_one() -> None:
    endpoints = [ep(f"e{i}") for i in range(8)]

    def picks(config: SchedulerConfig) -> list[str]:
        scheduler = build_scheduler(config)
        return [p.url for _ in range(12) if (p := scheduler.schedule(ctx(endpoints)).endpoint)]

    by_seed = picks(SchedulerConfig(scorers=(), picker="random_top", seed=5))
    by_param = picks(SchedulerConfig(scorers=(), picker="rt", seed=99,
                                     plugins=(PluginSpec("rt", "random_top", {"seed": 5}),)))
    assert by_seed == by_param
    assert by_seed != picks(SchedulerConfig(scorers=(), picker="random_top", seed=6))


@pytest.mark.parametrize(
    ("plugins", "filters", "message"),
    [
        ((PluginSpec("roomy", "not_saturated", {"max_wait": 2}),), ("roomy",),
         r"filter 'roomy' \(not_saturated\): unknown parameter\(s\) \['max_wait'\]; "
         "known: max_waiting"),
        ((PluginSpec("roomy", "not_saturated", {"max_waiting": -1}),), ("roomy",),
         "max_waiting must be a number >= 0"),
        ((PluginSpec("roomy", "not_saturated", {"max_waiting": "many"}),), ("roomy",),
         "max_waiting must be a number >= 0"),
        ((PluginSpec("roomy", "not_saturated", {"max_waiting": True}),), ("roomy",),
         "max_waiting must be a number >= 0"),  # compiled too
        ((PluginSpec("roomy", "not_saturated"), PluginSpec("roomy", "healthy")), ("roomy",),
         "declared twice"),
        ((PluginSpec("x", "no_such_plugin"),), ("healthy",), "unknown type 'no_such_plugin'"),
        ((PluginSpec("ll", "least_load"),), ("ll",), "unknown filter 'll'"),  # a scorer
        ((PluginSpec("h", "healthy", {"anything": 1}),), ("h",), "known: none"),
    ],
)
def test_bad_instances_are_refused(plugins: tuple[PluginSpec, ...], filters: tuple[str, ...],
                                   message: str) -> None:
    with pytest.raises(SchedulerConfigError, match=message):
        build_scheduler(SchedulerConfig(filters=filters, plugins=plugins))
