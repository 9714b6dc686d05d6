"""Replica choice inside a pool: filters → scorers → picker, configured by plugin name."""

from routing.scheduler.catalog import SchedulerConfigError, build_scheduler
from routing.scheduler.framework import (
    Filter,
    Picker,
    PluginSpec,
    PluginTiming,
    Scheduler,
    SchedulerConfig,
    ScheduleResult,
    SchedulingContext,
    Scorer,
)

__all__ = [
    "Filter",
    "Picker",
    "PluginSpec",
    "PluginTiming",
    "ScheduleResult",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerConfigError",
    "Scorer",
    "SchedulingContext",
    "build_scheduler",
]
