"""The whole fleet file: :class:`Fleet`, and loading it (:func:`load_fleet`, :func:`parse_fleet`).

One YAML file declares the fleet; the gateway routes over it, the simulator starts it, and the
deploy renderer turns each pool's levers into engine launch flags. Top-level keys starting with
``x-`` are ignored (YAML anchors). The checks across sections are here: unique pool names, an
endpoint in one pool only, a prefill pool's decode ``pair`` (one ``api_key_env``, one
``kv_cache_dtype``), each pool's scheduler plugins, and the tokenizer, adapter, SLO and planned
pool names against the pools'. A bad file raises :class:`FleetConfigError`, whose message
names the file, the field and the problem (:class:`FieldError`: a cross-section problem and its
field).
Tokenizer paths expand environment variables (:func:`expand_variables`) and resolve relative
to the file. See docs/fleet-file.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Field, ValidationError, model_validator

from config.engines import Role
from config.plan_section import PlanSection
from config.pools import Pool
from config.routing_section import FeatureSettings, RoutingSettings
from config.slos import ANY_MODEL, ModelSloSettings
from config.strict import Strict
from routing.policy import PolicyConfig
from routing.scheduler.catalog import SchedulerConfigError, validate
from routing.scheduler.framework import SchedulerConfig


class Fleet(Strict):
    """The whole fleet: every pool ridge may route to."""

    pools: Annotated[list[Pool], Field(min_length=1)]
    routing: RoutingSettings = RoutingSettings()
    slos: dict[str, ModelSloSettings] = Field(
        default_factory=dict, description="SLO per model name; '*' = every other model"
    )
    plan: PlanSection | None = Field(default=None, description="what ridge plan predicted")

    @model_validator(mode="after")
    def _consistent(self) -> Fleet:
        names = [p.name for p in self.pools]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"pool names must be unique, repeated: {sorted(dup)}")
        urls = [u for p in self.pools for u in p.endpoint_urls()]
        shared = {u for u in urls if urls.count(u) > 1}
        if shared:
            raise ValueError(f"an endpoint belongs to one pool only, shared: {sorted(shared)}")
        for pool in self.pools:
            _check_pair(pool, {p.name: p for p in self.pools})
            _check_scheduler(self, pool.name)
        _check_tokenizer_models(self.routing.features, {m for p in self.pools for m in p.models})
        _check_adapter_names(self.pools)
        served = {m for p in self.pools for m in (*p.models, *p.adapter_names())}
        _check_slo_models(self.slos, served)
        if self.plan is not None:
            _check_planned_pools(self.plan, set(names))
        return self

    def pool(self, name: str) -> Pool:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)

    def policy_config(self) -> PolicyConfig:
        """The lever policy's configuration, as routing's type."""
        return self.routing.policy.to_config()

    def scheduler_config(self, pool: str) -> SchedulerConfig:
        """The scheduler configuration of pool ``pool``: its own, else the fleet's, with the
        fleet's named plugin instances."""
        own = self.pool(pool).scheduler
        specs = tuple(p.to_spec() for p in self.routing.plugins)
        return (own or self.routing.scheduler).to_config(specs)


def _check_adapter_names(pools: list[Pool]) -> None:
    """An adapter's name is no pool's base model name (a request names one or the other)."""
    bases = {m for p in pools for m in p.models}
    for index, pool in enumerate(pools):
        clash = sorted(set(pool.adapter_names()) & bases)
        if clash:
            raise FieldError(f"pools.{index}.adapters",
                             f"{clash} also name a base model of the fleet; an adapter needs a "
                             "name of its own")


def _check_planned_pools(plan: PlanSection, pools: set[str]) -> None:
    unknown = sorted(set(plan.pools) - pools)
    if unknown:
        raise ValueError(f"plan: pools {unknown} are not pools of this fleet")


def _check_slo_models(slos: dict[str, ModelSloSettings], served: set[str]) -> None:
    unknown = sorted(set(slos) - served - {ANY_MODEL})
    if unknown:
        raise ValueError(f"slos name models no pool serves: {unknown}; served: {sorted(served)}")


class FieldError(ValueError):
    """A problem found by a check across the whole fleet, with the field it concerns."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem


def _check_scheduler(fleet: Fleet, pool: str) -> None:
    index = next(i for i, p in enumerate(fleet.pools) if p.name == pool)
    own = fleet.pools[index].scheduler is not None
    where = f"pools.{index}.scheduler" if own else "routing.scheduler"
    try:
        validate(fleet.scheduler_config(pool))
    except SchedulerConfigError as exc:
        raise FieldError(where, str(exc)) from exc


def _check_tokenizer_models(features: FeatureSettings, served: set[str]) -> None:
    unknown = sorted(set(features.tokenizers) - served)
    if unknown:
        raise FieldError("routing.features.tokenizers",
                         f"names models no pool serves: {unknown}; served: {sorted(served)}")


def _check_pair(pool: Pool, by_name: dict[str, Pool]) -> None:
    if pool.role is Role.PREFILL:
        if pool.pair is None:
            raise ValueError(f"pool {pool.name!r}: role prefill needs 'pair' (a decode pool)")
        other = by_name.get(pool.pair)
        if other is None or other.role is not Role.DECODE:
            raise ValueError(f"pool {pool.name!r}: pair {pool.pair!r} is not a decode pool")
        if other.api_key_env != pool.api_key_env:
            raise ValueError(f"pool {pool.name!r}: a prefill pool and its decode pool take "
                             "one request together, so they share one api_key_env")
        if other.levers.kv_cache_dtype != pool.levers.kv_cache_dtype:
            raise ValueError(f"pool {pool.name!r}: a prefill pool hands its KV over as stored, "
                             f"so it and its decode pool {other.name!r} share one "
                             "kv_cache_dtype")
    elif pool.pair is not None:
        raise ValueError(f"pool {pool.name!r}: only a prefill pool names a 'pair'")


class FleetConfigError(ValueError):
    """A fleet file that cannot be used; the message names the file, the field and the problem."""


def load_fleet(path: str | Path) -> Fleet:
    """Read and validate a fleet file."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise FleetConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise FleetConfigError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at "
                               f"offset {exc.start}); save it as UTF-8") from exc
    except yaml.YAMLError as exc:
        raise FleetConfigError(f"{path}: not valid YAML: {exc}") from exc
    return _relative_to(parse_fleet(raw, source=str(path)), path.parent)


_VARIABLE = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)")


def expand_variables(path: str, environ: Mapping[str, str]) -> str:
    """``path`` with ``$NAME`` / ``${NAME}`` replaced by the variable (left as written when
    unset) and ``${NAME:-default}`` by the variable, or ``default`` when unset or empty."""
    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        if match.group(2) is not None:
            return environ.get(name) or match.group(2)
        return environ.get(name, match.group(0))
    return _VARIABLE.sub(one, path)


def _resolve(path: str, base: Path) -> str:
    expanded = Path(expand_variables(path, os.environ))
    return str(expanded if expanded.is_absolute() else base / expanded)


def _relative_to(fleet: Fleet, base: Path) -> Fleet:
    """``fleet`` with its tokenizer and chat template paths' variables expanded and relative
    paths resolved against ``base``."""
    features = fleet.routing.features
    if not features.tokenizers:
        return fleet
    files = {m: t.model_copy(update={
        "path": _resolve(t.path, base),
        "chat_template": _resolve(t.chat_template, base) if t.chat_template else None})
        for m, t in features.tokenizers.items()}
    routing = fleet.routing.model_copy(
        update={"features": features.model_copy(update={"tokenizers": files})})
    return fleet.model_copy(update={"routing": routing})


def parse_fleet(raw: Any, source: str = "<fleet>") -> Fleet:
    """Validate already-parsed YAML; errors name ``source`` and each bad field. Top-level keys
    starting with ``x-`` are ignored (a place for YAML anchors)."""
    if not isinstance(raw, dict):
        raise FleetConfigError(f"{source}: expected a mapping with a 'pools' list at the top")
    # top-level keys starting with "x-" hold YAML anchors for reuse, as in compose files
    body = {k: v for k, v in raw.items() if not (isinstance(k, str) and k.startswith("x-"))}
    try:
        return Fleet.model_validate(body)
    except ValidationError as exc:
        raise FleetConfigError(_describe(source, exc)) from exc


def _describe(source: str, exc: ValidationError) -> str:
    lines = [f"{source}: invalid fleet configuration"]
    for err in exc.errors():
        cause = err.get("ctx", {}).get("error")
        if isinstance(cause, FieldError):
            lines.append(f"  {cause.path}: {cause.problem}")
            continue
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"  {where}: {err['msg']}")
    return "\n".join(lines)
