"""Read an engine's own ``/metrics`` page, independently of ridge's parser.

Uses ``prometheus_client.parser`` (not ``backends.engines.scrape``), so tests that compare ridge's
reading with this one compare two implementations. :func:`totals` sums every label set of a
sample name; :func:`wait_for` and :func:`poll` repeat a reading until it holds or a deadline
passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


def samples(base_url: str) -> list[Sample]:
    """Every sample on ``base_url/metrics``."""
    text = httpx.get(base_url + "/metrics", timeout=5.0).raise_for_status().text
    return [
        Sample(s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def totals(base_url: str) -> dict[str, float]:
    """Sample name → sum over its label sets."""
    out: dict[str, float] = {}
    for s in samples(base_url):
        out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def delta(before: Mapping[str, float], after: Mapping[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def running(base_url: str) -> float:
    """The engine's ``vllm:num_requests_running`` (requests in its running batch)."""
    return totals(base_url).get("vllm:num_requests_running", 0.0)


def wait_for(condition: Callable[[], bool], timeout_s: float, interval_s: float = 0.2) -> float:
    """Seconds until ``condition()`` held; raises TimeoutError after ``timeout_s``."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"condition still false after {timeout_s} s")
        time.sleep(interval_s)
    return time.monotonic() - start


def poll(read: Callable[[], T], done: Callable[[T], bool], timeout_s: float,
         interval_s: float = 0.2) -> T:
    """Call ``read`` until ``done`` accepts its value or ``timeout_s`` passes; the last value."""
    deadline = time.monotonic() + timeout_s
    value = read()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(interval_s)
        value = read()
    return value
