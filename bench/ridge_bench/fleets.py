"""The router comparison's routers, and the fleet file each cell runs on.

A *router* is a fleet file plus, optionally, the replica scheduler every pool uses (written as
the fleet's ``routing.scheduler``, see :mod:`backends.fleet_file`). The table :data:`ROUTERS`:

- ``round_robin``: the homogeneous fleet, no scorer, the ``round_robin`` picker (every replica
  ties, so the picker rotates);
- ``least_load``: the homogeneous fleet, the ``least_load`` scorer, ``max_score`` picker;
- ``cache_aware``: the homogeneous fleet, the ``cache_aware`` scorer (fewest uncached prompt
  tokens × (load + 1)), ``max_score`` picker;
- ``ridge``: the lever fleet with its own routing section (defaults unless the file sets them);
- ``ridge_sglang``: the lever fleet with an SGLang (radix cache) prefix pool, default routing.

More routers (fleet variants for experiments) come from :func:`custom_router`.

:func:`render` writes a cell's fleet file: the router's file with every endpoint moved to a free
127.0.0.1 port (so cells never collide with each other or anything else on the machine) and
the scheduler set, validated by :func:`backends.fleet_file.parse_fleet` before it is written.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from backends.fleet_file import Fleet, parse_fleet

ROOT = Path(__file__).resolve().parents[2]  # the repository root
HOMOGENEOUS = ROOT / "deploy" / "bench" / "homogeneous.yaml"
LEVERS = ROOT / "deploy" / "bench" / "levers.yaml"
LEVERS_SGLANG = ROOT / "deploy" / "bench" / "levers-sglang.yaml"


@dataclass(frozen=True)
class Router:
    """A fleet file and the scheduler to force on it (None: the file's own routing)."""

    name: str
    fleet: Path
    scheduler: Mapping[str, Any] | None = None
    description: str = ""


ROUTERS: Mapping[str, Router] = MappingProxyType({
    "round_robin": Router("round_robin", HOMOGENEOUS,
                          {"filters": ["healthy"], "scorers": {}, "picker": "round_robin"},
                          "homogeneous fleet, round-robin"),
    "least_load": Router("least_load", HOMOGENEOUS,
                         {"filters": ["healthy"], "scorers": {"least_load": 1.0},
                          "picker": "max_score"},
                         "homogeneous fleet, least load"),
    "cache_aware": Router("cache_aware", HOMOGENEOUS,
                          {"filters": ["healthy"], "scorers": {"cache_aware": 1.0},
                           "picker": "max_score"},
                          "homogeneous fleet, cache-aware only"),
    "ridge": Router("ridge", LEVERS, None, "lever pools, full ridge router"),
    "ridge_sglang": Router("ridge_sglang", LEVERS_SGLANG, None,
                           "lever pools with an SGLang prefix pool, full ridge router"),
})


def custom_router(spec: str) -> Router:
    """``NAME=PATH``: a router running the fleet file at PATH with its own routing section."""
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"expected NAME=FLEET_FILE, got {spec!r}")
    if name in ROUTERS:
        raise ValueError(f"router {name!r} already exists")
    return Router(name, Path(path).resolve(), None, f"{Path(path).name}, its own routing")


def with_ports(raw: Mapping[str, Any], ports: Callable[[], int]) -> dict[str, Any]:
    """A copy of the raw fleet mapping with every endpoint at ``http://127.0.0.1:<ports()>``."""
    out = copy.deepcopy(dict(raw))
    for pool in out["pools"]:
        pool["endpoints"] = [f"http://127.0.0.1:{ports()}" for _ in pool["endpoints"]]
    return out


def with_scheduler(raw: Mapping[str, Any], scheduler: Mapping[str, Any] | None
                   ) -> dict[str, Any]:
    """A copy with ``routing.scheduler`` set and no pool-level scheduler (None: unchanged)."""
    out = copy.deepcopy(dict(raw))
    if scheduler is None:
        return out
    out.setdefault("routing", {})["scheduler"] = copy.deepcopy(dict(scheduler))
    for pool in out["pools"]:
        pool.pop("scheduler", None)
    return out


def render(router: Router, path: Path, ports: Callable[[], int]) -> Fleet:
    """Write ``router``'s fleet, on fresh ports, to ``path``; returns it parsed."""
    raw = yaml.safe_load(router.fleet.read_text())
    body = with_scheduler(with_ports(raw, ports), router.scheduler)
    fleet = parse_fleet(body, source=f"{router.fleet.name} ({router.name})")
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return fleet
