"""Chaos hooks of a simulated endpoint, set from Python or through ``POST /sim/fault``.

Kinds (JSON ``{"kind": ..., ...}``; ``count`` limits a rule to the next N requests, default: until
cleared):

* ``delay`` ``{"delay_s": 2.0}``: wait before sending the first byte of ``/v1/*`` answers.
* ``reset`` ``{"after_chunks": 3}``: drop the connection with a TCP reset after that many SSE
  chunks (0: right after the headers; a non-streamed answer is dropped instead of sent).
* ``error`` ``{"status": 503}``: answer ``/v1/*`` requests with that status and the engine's
  error body.
* ``unhealthy``: health endpoints answer 503 (the engine keeps serving).
* ``close`` ``{"duration_s": 5.0}``: stop accepting connections and drop the open ones for that
  long (from Python: ``await endpoint.close()`` / ``await endpoint.reopen()``).
* ``clear`` (or ``DELETE /sim/fault``): remove every rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

RULE_KINDS: Mapping[str, tuple[str, float]] = MappingProxyType(
    {
        "delay": ("delay_s", 0.0),
        "reset": ("after_chunks", 0.0),
        "error": ("status", 503.0),
        "unhealthy": ("", 0.0),
    }
)
"""Rule kinds and their parameter (name, default)."""


@dataclass(slots=True)
class FaultRule:
    value: float
    remaining: int | None = None


@dataclass(frozen=True, slots=True)
class FaultCommand:
    kind: str
    value: float = 0.0
    count: int | None = None


class Faults:
    """The active rules of one endpoint."""

    def __init__(self) -> None:
        self.rules: dict[str, FaultRule] = {}

    def set(self, kind: str, value: float = 0.0, count: int | None = None) -> None:
        if kind not in RULE_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; known: {sorted(RULE_KINDS)}")
        self.rules[kind] = FaultRule(value, count)

    def clear(self) -> None:
        self.rules.clear()

    def active(self, kind: str) -> bool:
        return kind in self.rules

    def take(self, kind: str) -> float | None:
        """The rule's value if ``kind`` applies to this request (using up one of its count)."""
        rule = self.rules.get(kind)
        if rule is None:
            return None
        if rule.remaining is not None:
            rule.remaining -= 1
            if rule.remaining <= 0:
                del self.rules[kind]
        return rule.value

    def describe(self) -> dict[str, Any]:
        return {k: {"value": r.value, "remaining": r.remaining} for k, r in self.rules.items()}


def parse_command(body: Any) -> FaultCommand:
    """Read a ``POST /sim/fault`` body; ValueError says what is wrong."""
    if not isinstance(body, dict) or not isinstance(body.get("kind"), str):
        raise ValueError(
            'expected {"kind": "delay" | "reset" | "error" | "unhealthy" | "close" | "clear", ...}'
        )
    kind = body["kind"]
    count = body.get("count")
    if count is not None and (not isinstance(count, int) or count < 1):
        raise ValueError("count must be a positive integer")
    if kind == "clear":
        return FaultCommand("clear")
    if kind == "close":
        return FaultCommand("close", _number(body, "duration_s", None), None)
    if kind not in RULE_KINDS:
        raise ValueError(f"unknown fault kind {kind!r}")
    param, default = RULE_KINDS[kind]
    value = _number(body, param, default) if param else 0.0
    return FaultCommand(kind, value, count)


def _number(body: Mapping[str, Any], name: str, default: float | None) -> float:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{name} must be a non-negative number")
    return float(value)
