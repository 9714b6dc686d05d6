"""What a rendered deployment holds, before it is written for compose or Kubernetes.

:func:`make_blueprint` turns a fleet into an :class:`EngineBlueprint` per pool — a DNS-safe name,
replicas, image, command line (:mod:`backends.launch.recipes`), ports, GPUs, health and metrics
paths (:mod:`backends.engines.dialects`) — plus the gateway's :class:`RenderOptions`;
:func:`rendered_fleet` writes the fleet file the deployed gateway reads, its endpoints
rewritten to the deployment's names.

Names are DNS labels (``pd_prefill`` runs as ``engine-pd-prefill``; one cut to fit gets a
short hash). ridge serves clients on :data:`RIDGE_PORT` and its metrics on
:data:`RIDGE_ADMIN_PORT`. See docs/gateway.md#the-blueprint.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import version
from types import MappingProxyType
from typing import Any

import yaml

from backends.engines.dialects import dialect_for
from backends.launch.args import Arg, env_refs
from backends.launch.recipes import checkpoint, launcher
from config.engines import Role
from config.fleet import Fleet, parse_fleet
from config.pools import Pool

RIDGE_PORT = 8080
RIDGE_ADMIN_PORT = 9091
REDIS_PORT = 6379
PROMETHEUS_PORT = 9090
GRAFANA_PORT = 3000
ENGINE_PYTHON = "python3"  # the interpreter on the engine images' PATH
FLEET_DIR = "/etc/ridge"
FLEET_FILE = "fleet.yaml"
HF_CACHE = "/root/.cache/huggingface"  # where the engine images keep downloaded checkpoints
HF_TOKEN = "HF_TOKEN"  # optional: a Hugging Face token, for gated checkpoints

DEFAULT_IMAGES: Mapping[str, str] = MappingProxyType({
    "vllm": "vllm/vllm-openai:v0.32.0",
    "sglang": "lmsys/sglang:v0.5.23",
    "redis": "redis:7.4-alpine",
    "prometheus": "prom/prometheus:v3.5.0",
    "grafana": "grafana/grafana:12.0.0",
})  # fmt: skip
"""Image of every service but ridge (whose tag is its version, :func:`ridge_image`); the
engines' are the versions whose arguments :mod:`backends.launch.vllm` and
:mod:`backends.launch.sglang` were checked against."""

_DNS_LABEL_MAX = 63


class RenderError(ValueError):
    """A fleet that cannot be rendered into a deployment; the message says why."""


def ridge_image() -> str:
    """``ridge:VERSION``, the tag ``deploy/docker/Dockerfile`` is built under in the docs."""
    return f"ridge:{version('ridge')}"


@dataclass(frozen=True, slots=True)
class RenderOptions:
    """The gateway's replicas, the Kubernetes namespace, and images by service (``ridge``,
    ``vllm``, ``sglang``, ``redis``, ``prometheus``, ``grafana``)."""

    ridge_replicas: int = 2
    namespace: str = "ridge"
    images: Mapping[str, str] = field(default_factory=dict)

    def image(self, service: str) -> str:
        if service in self.images:
            return self.images[service]
        return ridge_image() if service == "ridge" else DEFAULT_IMAGES[service]


@dataclass(frozen=True, slots=True)
class EngineBlueprint:
    """One pool's engines. ``argv`` is the whole command (``python3 -m module ...``) with the
    API key as a reference; ``side_ports`` the other ports an engine listens on, by name."""

    pool: Pool
    name: str
    replicas: int
    image: str
    argv: tuple[Arg, ...]
    port: int
    side_ports: Mapping[str, int]
    gpus: int
    health_path: str
    metrics_path: str

    def secrets(self) -> list[str]:
        """The environment variables the command refers to."""
        return env_refs(self.argv)


@dataclass(frozen=True, slots=True)
class Blueprint:
    """The whole deployment: the fleet, its engines (in pool order) and the options."""

    fleet: Fleet
    engines: tuple[EngineBlueprint, ...]
    options: RenderOptions

    def secrets(self) -> list[str]:
        """Every API-key variable, once: the engines take it, ridge sends it upstream."""
        names = (n for e in self.engines for n in e.secrets())
        keys = (p.api_key_env for p in self.fleet.pools if p.api_key_env)
        return sorted(set(names) | set(keys))


def dns_label(prefix: str, name: str) -> str:
    """``prefix-name`` as a DNS label (RFC 1123, at most 63 characters, starts with a letter)."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "x"
    label = f"{prefix}-{slug}"
    if len(label) <= _DNS_LABEL_MAX:
        return label
    digest = hashlib.sha256(name.encode()).hexdigest()[:6]
    return f"{label[:_DNS_LABEL_MAX - 7].rstrip('-')}-{digest}"


def engine_blueprint(pool: Pool, options: RenderOptions) -> EngineBlueprint:
    """The engines of one pool."""
    launch = launcher(pool)
    dialect = dialect_for(pool.engine)
    argv = launch.command(ENGINE_PYTHON, pool, "0.0.0.0", launch.port, checkpoint(pool))
    return EngineBlueprint(
        pool=pool, name=dns_label("engine", pool.name), replicas=len(pool.endpoints),
        image=options.image(pool.engine.value), argv=tuple(argv), port=launch.port,
        side_ports=side_ports(pool, launch.side_ports), gpus=launch.gpus(pool),
        health_path=dialect.health_path, metrics_path=dialect.metrics_path,
    )  # fmt: skip


def side_ports(pool: Pool, by_role: Mapping[Role, Mapping[str, int]]) -> dict[str, int]:
    """The ports an engine of ``pool`` listens on besides its HTTP port: its role's, and its
    KV event streams' (``kv_events``)."""
    events = pool.kv_events.ports() if pool.kv_events is not None else {}
    return {**by_role.get(pool.role, {}), **events}


def make_blueprint(fleet: Fleet, options: RenderOptions = RenderOptions()) -> Blueprint:
    """The deployment of ``fleet``; :class:`RenderError` if it cannot be rendered."""
    if options.ridge_replicas < 1:
        raise RenderError("ridge needs at least one replica")
    try:
        engines = tuple(engine_blueprint(p, options) for p in fleet.pools)
    except ValueError as exc:
        raise RenderError(str(exc)) from exc
    names = [e.name for e in engines]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise RenderError(f"pools whose names differ only in case or punctuation would share "
                          f"the deployment names {clash}: rename one of them")
    return Blueprint(fleet, engines, options)


def rendered_fleet(blueprint: Blueprint, endpoints: Mapping[str, list[str]]
                   ) -> tuple[dict[str, Any], list[str]]:
    """The fleet file of the deployed gateway — every pool's endpoints replaced by
    ``endpoints[pool name]`` — and warnings. Tokenizer files named in
    ``routing.features.tokenizers`` are not in the ridge image, so that section is left out
    (ridge then estimates prompt tokens from characters), with a warning."""
    raw = blueprint.fleet.model_dump(mode="json", exclude_unset=True)
    warnings = []
    for pool in raw["pools"]:
        pool["endpoints"] = endpoints[pool["name"]]
        warnings += _own_event_hosts(pool)
    features = raw.get("routing", {}).get("features", {})
    if features.pop("tokenizers", None):
        warnings.append("routing.features.tokenizers left out of the rendered fleet file: the "
                        "tokenizer files are not in the ridge image (bake them into an image "
                        "built FROM it and add the section back)")
    parse_fleet(raw, source="rendered fleet")  # the deployed gateway must accept it
    return raw, warnings


def _own_event_hosts(pool: dict[str, Any]) -> list[str]:
    """Drop a pool's explicit KV event addresses: each rendered engine has a host of its own
    and publishes on ``kv_events.port`` there (and the endpoints they followed are gone)."""
    events = pool.get("kv_events") or {}
    dropped = [k for k in ("addresses", "replay_addresses") if events.pop(k, None) is not None]
    if not dropped:
        return []
    return [f"pool {pool['name']}: kv_events.{' and '.join(dropped)} left out of the rendered "
            "fleet file: each rendered engine publishes on kv_events' ports on its own host"]


@dataclass(frozen=True, slots=True)
class Rendered:
    """A rendered deployment: file path (relative to the output folder) → text, things the
    operator should know (warnings), and the environment variables or secrets it needs."""

    files: dict[str, str]
    warnings: list[str]
    secrets: list[str]


class _BlockDumper(yaml.SafeDumper):
    """Safe YAML whose multi-line strings (files inside ConfigMaps) are literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)


def to_yaml(*documents: Any) -> str:
    """``documents`` as YAML (several: separated by ``---``), keys in the order given."""
    return yaml.dump_all(documents, Dumper=_BlockDumper, sort_keys=False, width=100,
                         allow_unicode=True)
