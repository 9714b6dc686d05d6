"""What the planner chooses from: pool recipes, fleets of them on N GPUs, and their fleet files.

A :class:`Recipe` is one pool's engine levers (:class:`config.levers.Levers` as fleet-file
data): prefix caching, the chunked-prefill budget, speculative decoding (method and K), fp8
KV, a host KV tier, or a prefill/decode pair. A :class:`Candidate` is a fleet: recipes with
replica counts that add up to the GPUs (one GPU per engine; a pair counts its prefill and
its decode engines), and the routing policy's thresholds where they matter
(:data:`POLICY_STEPS`). :func:`fleet_document` writes a candidate as the fleet file
``ridge serve`` and ``ridge render`` read. The search over them is :mod:`gateway.plan.search`;
docs/planning.md#the-search-space says why these recipes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from backends.sim.configure import engine_config
from config.builtin_facts import find_accelerator
from config.fleet import FleetConfigError, parse_fleet

GENERAL = "general"
"""The recipe of an ordinary prefix-caching pool (the planner's baseline)."""


@dataclass(frozen=True, slots=True)
class Recipe:
    """One pool's levers (fleet-file ``levers:``), or a prefill/decode pair when ``pair``:
    then ``levers`` are the prefill pool's and ``decode_levers`` the decode pool's."""

    name: str
    levers: Mapping[str, Any]
    pair: bool = False
    decode_levers: Mapping[str, Any] = field(default_factory=dict)
    why: str = ""


def _cached(budget: int = 8192, **more: Any) -> Mapping[str, Any]:
    return MappingProxyType({"prefix_caching": True,
                             "chunked_prefill": {"token_budget": budget}, **more})


RECIPES: tuple[Recipe, ...] = (
    Recipe(GENERAL, _cached(), why="prefix caching with vLLM's default chunk budget"),
    Recipe("chunk-512", _cached(512), why="small prefill chunks keep decodes' TPOT low"),
    Recipe("chunk-2048", _cached(2048), why="medium prefill chunks"),
    Recipe("spec-ngram-2", _cached(speculative={"method": "ngram", "num_draft_tokens": 2}),
           why="n-gram speculation, K = 2: faster decode at low load"),
    Recipe("spec-ngram-4", _cached(speculative={"method": "ngram", "num_draft_tokens": 4}),
           why="n-gram speculation, K = 4"),
    Recipe("spec-eagle-3", _cached(speculative={"method": "eagle", "num_draft_tokens": 3}),
           why="EAGLE speculation, K = 3, at the draft's stated acceptance"),
    Recipe("fp8-kv", _cached(kv_cache_dtype="fp8"), why="fp8 KV: twice the tokens in the cache"),
    Recipe("host-kv", _cached(host_kv_cache={"size_gb": 64}),
           why="a 64 GB host KV tier keeps evicted prefixes for reuse"),
    Recipe("pd", _cached(), pair=True, decode_levers=MappingProxyType({"prefix_caching": True}),
           why="prefill and decode on separate engines: long prompts stop stalling decodes"),
)
"""Every recipe the search may use."""

BY_NAME: Mapping[str, Recipe] = MappingProxyType({r.name: r for r in RECIPES})

POLICY_STEPS: Mapping[str, tuple[float, ...]] = MappingProxyType({
    "long_prompt_tokens": (1024, 2048, 4096, 8192),
    "high_prefix_share": (0.3, 0.5, 0.7),
    "decode_heavy_ratio": (0.5, 1.0, 2.0),
})
"""The routing policy thresholds the search moves, and the values it tries (units:
:class:`config.routing_section.PolicySettings`)."""


@dataclass(frozen=True, slots=True)
class Part:
    """``replicas`` engines of ``recipe``; a pair's ``decode`` engines beside them."""

    recipe: str
    replicas: int
    decode: int = 0

    @property
    def gpus(self) -> int:
        return self.replicas + self.decode


ROUND_ROBIN = "round_robin"
"""The replica picker of a baseline that ignores load and cache (every pool round robin)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A fleet: its parts (sorted by recipe name), policy thresholds moved from defaults, and
    the replica picker when not the default scheduler (:data:`ROUND_ROBIN`)."""

    parts: tuple[Part, ...]
    policy: tuple[tuple[str, float], ...] = ()
    picker: str = ""

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.parts)

    @property
    def label(self) -> str:
        """``general×4 + pd(2:2)``, with the moved thresholds after a bar."""
        parts = " + ".join(f"{p.recipe}({p.replicas}:{p.decode})" if p.decode
                           else f"{p.recipe}×{p.replicas}" for p in self.parts)
        if self.policy:
            parts += " | " + ", ".join(f"{k}={v:g}" for k, v in self.policy)
        if self.picker:
            parts += f" ({self.picker.replace('_', ' ')})"
        return parts

    def with_policy(self, name: str, value: float) -> Candidate:
        moved = dict(self.policy)
        moved[name] = value
        return replace(self, policy=tuple(sorted(moved.items())))


def candidate(*parts: Part, policy: Mapping[str, float] | None = None) -> Candidate:
    """A candidate with its parts in canonical order (equal fleets compare equal)."""
    merged: dict[str, Part] = {}
    for p in parts:
        if p.replicas < 1 or (BY_NAME[p.recipe].pair and p.decode < 1):
            raise ValueError(f"{p.recipe}: every pool needs an engine")
        old = merged.get(p.recipe)
        merged[p.recipe] = p if old is None else Part(p.recipe, old.replicas + p.replicas,
                                                      old.decode + p.decode)
    return Candidate(tuple(sorted(merged.values(), key=lambda p: p.recipe)),
                     tuple(sorted((policy or {}).items())))


def scaled(c: Candidate, gpus: int) -> Candidate | None:
    """``c``'s pools in the same proportions on ``gpus`` GPUs (each side of a pair at least
    one engine); None when it has more pools than that allows."""
    sides = [(p.recipe, k, n) for p in c.parts for k, n in enumerate((p.replicas, p.decode))
             if n > 0]
    if len(sides) > gpus:
        return None
    share = [n * gpus / c.gpus for _, _, n in sides]
    counts = [max(1, int(s)) for s in share]
    while sum(counts) < gpus:  # the largest remainders first
        i = max(range(len(sides)), key=lambda j: share[j] - counts[j])
        counts[i] += 1
    while sum(counts) > gpus:
        i = max((j for j in range(len(sides)) if counts[j] > 1),
                key=lambda j: counts[j] - share[j])
        counts[i] -= 1
    parts: dict[str, list[int]] = {}
    for (recipe, k, _), n in zip(sides, counts, strict=True):
        parts.setdefault(recipe, [0, 0])[k] = n
    return replace(candidate(*(Part(r, a, b) for r, (a, b) in parts.items()),
                             policy=dict(c.policy)), picker=c.picker)


def uniform(recipe: Recipe, gpus: int) -> Iterator[Candidate]:
    """Every GPU on ``recipe``: one pool (a pair: each prefill/decode split)."""
    if not recipe.pair:
        yield candidate(Part(recipe.name, gpus))
        return
    for prefill in sorted({max(1, gpus // 4), max(1, gpus // 2), max(1, 3 * gpus // 4)}):
        if 1 <= prefill < gpus:
            yield candidate(Part(recipe.name, prefill, gpus - prefill))


def policy_matters(c: Candidate, name: str) -> bool:
    """Whether threshold ``name`` changes where this fleet's requests go."""
    recipes = [BY_NAME[p.recipe] for p in c.parts]
    if name == "long_prompt_tokens":
        return any(r.pair for r in recipes)
    if name == "decode_heavy_ratio":
        return any("speculative" in r.levers for r in recipes) and len(recipes) > 1
    return len(recipes) > 1


# -- fleet files --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Brief:
    """What every pool serves and runs on: the model and accelerator (catalogue names,
    :mod:`config.builtin_facts`), the engine, the SLO bounds [s], the engines' context
    [tokens] (None: the model's), the EAGLE draft model and its per-draft acceptance α (the
    simulator's assumption for it), the accelerator's peak FLOP/s and memory bandwidth as
    multiples of its datasheet's (to ask how a plan fares on slower engines), and the first
    engine port."""

    model: str
    accelerator: str
    engine: str = "vllm"
    ttft_s: float | None = None
    tpot_s: float | None = None
    max_context: int | None = None
    draft_model: str | None = None
    acceptance: float = 0.7
    flops_scale: float = 1.0
    bandwidth_scale: float = 1.0
    first_port: int = 8001

    def hardware(self) -> str | dict[str, Any]:
        """The pools' ``hardware:``: the catalogue name, with the rates scaled when asked."""
        if self.flops_scale == 1.0 and self.bandwidth_scale == 1.0:
            return self.accelerator
        spec = find_accelerator(self.accelerator)
        return {"name": self.accelerator, "peak_flops": spec.peak_flops * self.flops_scale,
                "mem_bandwidth": spec.mem_bandwidth * self.bandwidth_scale}


def available(recipe: Recipe, brief: Brief) -> bool:
    """Whether ``recipe`` can run for ``brief``: a draft-model method needs a draft model."""
    spec = recipe.levers.get("speculative")
    return not (isinstance(spec, Mapping) and spec.get("method") != "ngram"
                and brief.draft_model is None)


def why_not(recipe: Recipe, brief: Brief) -> str | None:
    """Why an engine of ``recipe`` would not start for ``brief`` (its fleet file refused, its
    KV cache shorter than the context, a host tier no larger than the device's), or None."""
    c = candidate(Part(recipe.name, 1, 1 if recipe.pair else 0))
    try:
        for pool in parse_fleet(fleet_document(c, brief)).pools:
            engine_config(pool)
    except (FleetConfigError, ValueError) as exc:
        return str(exc)
    return None


def fleet_document(c: Candidate, brief: Brief) -> dict[str, Any]:
    """``c`` as a fleet file (a mapping ``config.fleet.parse_fleet`` takes): one pool per
    recipe (a pair: ``NAME-prefill`` and ``NAME-decode``), endpoints on consecutive local
    ports, the SLO under ``slos``."""
    pools: list[dict[str, Any]] = []
    port = brief.first_port
    for part in c.parts:
        recipe = BY_NAME[part.recipe]
        if recipe.pair:
            prefill, decode = f"{recipe.name}-prefill", f"{recipe.name}-decode"
            pools.append(_pool(prefill, recipe.levers, part.replicas, port, brief,
                               role="prefill", pair=decode))
            port += part.replicas
            pools.append(_pool(decode, recipe.decode_levers, part.decode, port, brief,
                               role="decode"))
            port += part.decode
        else:
            pools.append(_pool(recipe.name, recipe.levers, part.replicas, port, brief))
            port += part.replicas
    doc: dict[str, Any] = {"pools": pools}
    routing: dict[str, Any] = {}
    if c.policy:
        routing["policy"] = {k: int(v) if k.endswith("_tokens") else v for k, v in c.policy}
    if c.picker:
        routing["scheduler"] = {"filters": ["healthy"], "scorers": {}, "picker": c.picker}
    if routing:
        doc["routing"] = routing
    bounds = {k: v for k, v in (("ttft_s", brief.ttft_s), ("tpot_s", brief.tpot_s))
              if v is not None}
    if bounds:
        doc["slos"] = {brief.model: bounds}
    return doc


def _pool(name: str, levers: Mapping[str, Any], replicas: int, port: int, brief: Brief,
          **role: str) -> dict[str, Any]:
    model: Any = brief.model
    if brief.max_context is not None:
        model = {"name": brief.model, "max_context": brief.max_context}
    pool = {"name": name, "engine": brief.engine, "models": [brief.model], **role,
            "endpoints": [f"http://127.0.0.1:{port + i}" for i in range(replicas)],
            "levers": _plain(levers), "model": model, "hardware": brief.hardware()}
    spec = pool["levers"].get("speculative")
    if isinstance(spec, dict) and spec.get("method") != "ngram":
        spec["draft_model"] = brief.draft_model
        pool["simulator"] = {"acceptance_rate": brief.acceptance}
    return pool


def _plain(value: Any) -> Any:
    """``value`` with its mappings as plain dicts (for YAML and the fleet file's schema)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value
