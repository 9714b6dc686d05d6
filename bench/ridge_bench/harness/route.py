"""Parse ridge's ``x-ridge-route`` response header: where a request went and why.

Format: ``key=value`` fields separated by ``;``, e.g.
``pool=radix; lever=prefix_cache; reason=f=0.82,match=14/16``. A field's key ends at its first
``=`` (a value may itself hold ``=`` and ``,``); blanks around fields are dropped; a field
without ``=`` is ignored; when a key repeats, the first one wins. A missing or empty header
gives a :class:`Route` of Nones (the request never reached a pool, or the gateway is not ridge).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

HEADER = "x-ridge-route"


@dataclass(frozen=True, slots=True)
class Route:
    """The header's fields; ``pool``, ``lever`` and ``reason`` pulled out for convenience."""

    pool: str | None = None
    lever: str | None = None
    reason: str | None = None
    fields: Mapping[str, str] = field(default_factory=dict)


def parse_route(header: str | None) -> Route:
    """The fields of one header value (module doc)."""
    fields: dict[str, str] = {}
    for part in (header or "").split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key.strip() and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    return Route(fields.get("pool") or None, fields.get("lever") or None,
                 fields.get("reason") or None, fields)
