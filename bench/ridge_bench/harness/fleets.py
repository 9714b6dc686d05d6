"""The router comparison's routers, and the fleet file each cell runs on.

A *router* is a fleet file plus, optionally, the replica scheduler every pool uses (the fleet's
``routing.scheduler``, see :mod:`config.routing_section`). :data:`ROUTERS` holds the compared
ones (round-robin, least-load and cache-aware over the homogeneous fleet, ridge over the lever
fleets, and the peers: the SGLang router's policies, smg's and vLLM's router's cache_aware);
:func:`custom_router` makes more from ``NAME=FLEET_FILE`` or ``NAME=FLEET_FILE@KIND:POLICY``.
``Router.gateway`` says what runs in front of the fleet: ``ridge``, or ``KIND:POLICY`` for the
Rust router of that kind (a key of :data:`ridge_bench.harness.gateways.ROUTERS`) with a policy
of :data:`PEER_POLICIES`.

:func:`render` writes a cell's fleet file: every endpoint on a distinct free 127.0.0.1 port,
the scheduler set, validated by :func:`config.fleet.parse_fleet`. :class:`Extras` adds a
tokenizer to every model (:func:`with_tokenizer`) and KV-cache events on free ports to every
pool that publishes them (:func:`with_kv_events`, which needs the tokenizer).
See docs/benchmarks/router.md#routers-and-fleets.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from config.fleet import Fleet, parse_fleet
from config.kv_events import KV_EVENT_ENGINES
from ridge_bench.harness import gateways

ROOT = Path(__file__).resolve().parents[3]  # the repository root
HOMOGENEOUS = ROOT / "deploy" / "bench" / "homogeneous.yaml"
LEVERS = ROOT / "deploy" / "bench" / "levers.yaml"
LEVERS_SGLANG = ROOT / "deploy" / "bench" / "levers-sglang.yaml"
RIDGE = "ridge"
PEER_POLICIES = ("cache_aware", "round_robin", "random")
"""The policies a peer may run: every Rust router of
:data:`ridge_bench.harness.gateways.ROUTERS` takes these three ``--policy`` values."""


def peer_gateway(kind: str, policy: str) -> str:
    """The :attr:`Router.gateway` of the Rust router of ``kind`` with ``policy``."""
    return f"{kind}:{policy}"


@dataclass(frozen=True)
class Router:
    """A fleet file, the scheduler to force on it (None: the file's own routing), and the
    gateway in front of it: :data:`RIDGE` or ``KIND:POLICY`` (module doc)."""

    name: str
    fleet: Path
    scheduler: Mapping[str, Any] | None = None
    description: str = ""
    gateway: str = RIDGE

    @property
    def peer(self) -> tuple[str, str] | None:
        """The Rust router's kind and policy in front of the fleet, or None when ridge is."""
        kind, sep, policy = self.gateway.partition(":")
        return (kind, policy) if sep else None


def _peer(name: str, kind: str, policy: str) -> Router:
    """The homogeneous fleet behind the Rust router of ``kind`` with ``policy``."""
    how = f"homogeneous fleet, {gateways.ROUTERS[kind].name}, {policy}"
    return Router(name, HOMOGENEOUS, None, how, peer_gateway(kind, policy))


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
    "sglang_ca": _peer("sglang_ca", "sglang", "cache_aware"),
    "sglang_rr": _peer("sglang_rr", "sglang", "round_robin"),
    "smg_ca": _peer("smg_ca", "smg", "cache_aware"),
    "vllm_ca": _peer("vllm_ca", "vllm-router", "cache_aware"),
})


def is_peer(text: str) -> bool:
    """Whether ``text`` starts as a peer's gateway does: ``KIND:`` of a known router kind."""
    kind, sep, _ = text.partition(":")
    return bool(sep) and kind in gateways.ROUTERS


def parse_gateway(text: str) -> str:
    """``ridge`` or ``KIND:POLICY`` (KIND a router kind, POLICY in :data:`PEER_POLICIES`),
    else ValueError."""
    kind, _, policy = text.partition(":")
    if text == RIDGE or (is_peer(text) and policy in PEER_POLICIES):
        return text
    raise ValueError(f"gateway {text!r}: expected {RIDGE} or KIND:POLICY with KIND in "
                     f"{', '.join(gateways.ROUTERS)} and POLICY in {', '.join(PEER_POLICIES)}")


def custom_router(spec: str) -> Router:
    """``NAME=PATH``: a router running the fleet file at PATH with its own routing section;
    ``NAME=PATH@GATEWAY``: the same fleet behind GATEWAY (:func:`parse_gateway`). Only a last
    ``@`` followed by ``ridge`` or ``KIND:`` starts the gateway, so PATH may contain ``@``."""
    name, sep, rest = spec.partition("=")
    path, at, gateway = rest.rpartition("@")
    if not at or not (gateway == RIDGE or is_peer(gateway)):
        path, gateway = rest, RIDGE
    if not sep or not name or not path:
        raise ValueError(f"expected NAME=FLEET_FILE[@ridge|@KIND:POLICY], got {spec!r}")
    if name in ROUTERS:
        raise ValueError(f"router {name!r} already exists")
    gateway = parse_gateway(gateway)
    kind, _, policy = gateway.partition(":")
    how = "its own routing" if gateway == RIDGE else f"{gateways.ROUTERS[kind].name}, {policy}"
    return Router(name, Path(path).resolve(), None, f"{Path(path).name}, {how}", gateway)


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


@dataclass(frozen=True)
class Extras:
    """What every cell's fleet gets on top of its router's file (module doc): ``tokenizer``,
    the model folder every served model's prompt tokens are counted with (None: the file's
    own tokenizers, if any), and ``kv_events``: the prefix-caching pools publish KV-cache
    events (needs ``tokenizer``)."""

    tokenizer: Path | None = None
    kv_events: bool = False

    def meta(self) -> dict[str, Any]:
        """The extras as results metadata: the tokenizer's folder name (None without one)
        and whether KV-cache events were on."""
        name = None if self.tokenizer is None else self.tokenizer.resolve().name
        return {"tokenizer": name, "kv_events": self.kv_events}


def distinct(ports: Callable[[], int], tries: int = 100) -> Callable[[], int]:
    """``ports`` never giving the same port twice: a repeat is skipped (RuntimeError after
    ``tries`` repeats in a row)."""
    given: set[int] = set()

    def next_port() -> int:
        for _ in range(tries):
            port = ports()
            if port not in given:
                given.add(port)
                return port
        raise RuntimeError(f"no new port after {tries} tries")

    return next_port


def with_tokenizer(raw: Mapping[str, Any], folder: Path | None) -> dict[str, Any]:
    """A copy with ``folder`` (made absolute) as the required tokenizer of every model any
    pool serves, merged into ``routing.features.tokenizers`` (None: unchanged)."""
    out = copy.deepcopy(dict(raw))
    if folder is None:
        return out
    entry = {"path": str(folder.resolve()), "required": True}
    features = out.setdefault("routing", {}).setdefault("features", {})
    tokenizers = features.setdefault("tokenizers", {})
    for pool in out["pools"]:
        for model in pool["models"]:
            tokenizers[model] = dict(entry)
    return out


def publishes_kv_events(pool: Mapping[str, Any]) -> bool:
    """Whether a raw pool's engines can publish KV-cache events: an engine whose events ridge
    reads (:data:`config.kv_events.KV_EVENT_ENGINES`) with prefix caching on."""
    engines = {e.value for e in KV_EVENT_ENGINES}
    levers = pool.get("levers") or {}
    return pool.get("engine") in engines and bool(levers.get("prefix_caching", False))


def with_kv_events(raw: Mapping[str, Any], ports: Callable[[], int]) -> dict[str, Any]:
    """A copy where every pool that :func:`publishes_kv_events` has ``kv_events`` with a
    publish and a replay address ``tcp://127.0.0.1:<ports()>`` per endpoint (the pool's
    ``port`` and ``replay_port`` are its first endpoint's)."""
    out = copy.deepcopy(dict(raw))
    for pool in out["pools"]:
        if not publishes_kv_events(pool):
            continue
        publish = [ports() for _ in pool["endpoints"]]
        replay = [ports() for _ in pool["endpoints"]]
        pool["kv_events"] = {
            "port": publish[0], "replay_port": replay[0],
            "addresses": [f"tcp://127.0.0.1:{p}" for p in publish],
            "replay_addresses": [f"tcp://127.0.0.1:{p}" for p in replay],
        }
    return out


def render(router: Router, path: Path, ports: Callable[[], int], extras: Extras = Extras()
           ) -> Fleet:
    """Write ``router``'s fleet with ``extras``, on fresh distinct ports, to ``path``; returns
    it parsed."""
    fresh = distinct(ports)
    raw = yaml.safe_load(router.fleet.read_text())
    body = with_scheduler(with_ports(raw, fresh), router.scheduler)
    body = with_tokenizer(body, extras.tokenizer)
    if extras.kv_events:
        body = with_kv_events(body, fresh)
    fleet = parse_fleet(body, source=f"{router.fleet.name} ({router.name})")
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return fleet
