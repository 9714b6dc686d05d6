"""Replica choice inside a pool: filters → scorers → picker, configured by plugin name."""

from routing.scheduler.framework import (
    Filter,
    Picker,
    PluginTiming,
    Scheduler,
    SchedulerConfig,
    ScheduleResult,
    SchedulingContext,
    Scored,
    Scorer,
)
from routing.scheduler.registry import SchedulerConfigError, build_scheduler

__all__ = [
    "Filter",
    "Picker",
    "PluginTiming",
    "ScheduleResult",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerConfigError",
    "Scored",
    "Scorer",
    "SchedulingContext",
    "build_scheduler",
]
