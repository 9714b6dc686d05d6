"""The fleet file's ``pools:``: sets of identical engine replicas sharing one configuration.

A :class:`Pool` names its engine and role (:mod:`config.engines`), served ``models``, distinct
HTTP ``endpoints`` (``resolve: dns``: their host names looked up at every poll, http only), its
levers (:mod:`config.levers`), model and hardware facts (:mod:`config.facts`; without them a
pool routes as any other, but has no MFU/MBU and no ridge point, and the simulator refuses it),
LoRA :class:`Adapter` names served on top of its base model, and its KV-cache event streams
(:mod:`config.kv_events`). The checks that need a whole pool are here: a host KV tier its
engine offers, event streams its engines can publish, adapter names of their own. ``checkpoint``
and ``engine_args`` feed the rendered launch commands (:mod:`backends.launch.recipes`).
:func:`pool_levers` names a pool's levers. See docs/fleet-file.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import (
    AnyHttpUrl,
    Field,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from config.engines import Engine, Role
from config.facts import HardwareFacts, ModelFacts, SimulatorKnobs, hardware_input, model_input
from config.kv_events import KV_EVENT_ENGINES, KvEvents, KvEventSource
from config.levers import HOST_KV_MECHANISMS, HostKvMechanism, Levers
from config.routing_section import SchedulerSettings
from config.strict import Strict
from routing.snapshots import (
    CHUNKED_PREFILL,
    FP8_KV_CACHE,
    HOST_KV_CACHE,
    PD_DISAGGREGATION,
    PREFIX_CACHE,
    SPECULATIVE,
)

LORA_RANKS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The LoRA ranks an engine can be sized for (vLLM 0.32 ``--max-lora-rank`` choices,
``vllm/config/lora.py`` ``MaxLoRARanks``); a declared ``rank`` is rounded up to one of them."""


class Adapter(Strict):
    """A LoRA adapter a pool's engines serve as one more model name, on top of the pool's base
    model (its first ``models`` name, the adapter's ``parent`` in ``/v1/models``). ``path``:
    where the engine loads it from (a folder inside the engine's container, or a Hugging Face
    id), rendered into the launch flags; None = loaded another way (at runtime through the
    engine's load-adapter API, or by an engine-side resolver), so ridge only routes to it.
    ``rank``: the adapter's LoRA rank r, if known; the pool's engines are sized for the largest.
    A plain string stands for ``name``."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:/-]+$", max_length=128)]
    path: str | None = None
    rank: Annotated[int, Field(gt=0, le=LORA_RANKS[-1])] | None = None


class Pool(Strict):
    """A set of identical engine replicas sharing one configuration (its levers)."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=64)]
    engine: Engine
    role: Role = Role.MIXED
    models: Annotated[list[str], Field(min_length=1)]
    endpoints: Annotated[list[AnyHttpUrl], Field(min_length=1)]
    levers: Levers = Levers()
    model: ModelFacts | None = Field(
        default=None, description="the served model's facts: a catalogue name, full facts, or "
        "{name, overrides}; None = no MFU/MBU for this pool (module docstring)"
    )
    hardware: HardwareFacts | None = Field(
        default=None, description="one accelerator's facts: a catalogue name, full facts, or "
        "{name, overrides}; None = no MFU/MBU for this pool (module docstring)"
    )
    pair: str | None = Field(
        default=None, description="for role prefill: the decode pool it hands KV to"
    )
    simulator: SimulatorKnobs = SimulatorKnobs()
    scheduler: SchedulerSettings | None = Field(
        default=None, description="replica choice in this pool; None = routing.scheduler"
    )
    api_key_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = Field(
        default=None, description="the environment variable holding the API key the pool's "
        "engines were started with (vLLM/SGLang --api-key); ridge sends it upstream as "
        "Authorization: Bearer. The key itself never goes in this file."
    )
    checkpoint: str | None = Field(
        default=None, description="what the engines load (a Hugging Face repo id, or a path "
        "inside the engine's container), for rendered launch commands; None = the first of "
        "models"
    )
    engine_args: list[str] = Field(
        default_factory=list, description="more engine flags, appended verbatim to the "
        "rendered launch command (e.g. --enable-auto-tool-choice --tool-call-parser hermes); "
        "flags that set a lever or a launch setting are refused there"
    )
    resolve: Literal["none", "dns"] = Field(
        default="none", description="dns: each endpoint's host name is looked up at every poll "
        "and the pool is one endpoint per address found (same scheme, port and path), so "
        "scaling the engines behind the name (a Kubernetes headless Service) needs no change "
        "to this file (backends.registry.resolver); none: the endpoints as written"
    )
    adapters: list[Adapter] = Field(
        default_factory=list, description="LoRA adapters the pool's engines serve besides "
        "its models (Adapter); requests naming one go only to endpoints that have it"
    )
    kv_events: KvEvents | None = Field(
        default=None, description="where the engines publish their KV-cache events (vLLM's "
        "or SGLang's --kv-events-config), which the gateway subscribes to (KvEvents); None = "
        "no stream"
    )

    @field_validator("adapters", mode="before")
    @classmethod
    def _names_alone(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [{"name": v} if isinstance(v, str) else v for v in value]
        return value

    @model_validator(mode="after")
    def _adapters_distinct(self) -> Pool:
        names = [a.name for a in self.adapters]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"adapter listed twice: {twice}")
        clash = sorted(set(names) & set(self.models))
        if clash:
            raise ValueError(f"an adapter takes a name of its own, not one of models: {clash}")
        return self

    @model_validator(mode="after")
    def _host_tier_on_this_engine(self) -> Pool:
        tier = self.levers.host_kv_cache
        if tier is None:
            return self
        offered = HOST_KV_MECHANISMS[self.engine]
        if tier.mechanism is not None and tier.mechanism not in offered:
            raise ValueError(f"levers.host_kv_cache.mechanism {tier.mechanism!r} is not "
                             f"{self.engine.value}'s: it offers {', '.join(offered)}")
        if self.engine is Engine.SGLANG and not tier.size_gb.is_integer():
            raise ValueError(f"levers.host_kv_cache.size_gb {tier.size_gb}: SGLang's "
                             "--hicache-size takes whole GB")
        return self

    @model_validator(mode="after")
    def _kv_events_usable(self) -> Pool:
        events = self.kv_events
        if events is None:
            return self
        if self.engine not in KV_EVENT_ENGINES:
            raise ValueError(f"kv_events: ridge reads the KV event formats of "
                             f"{', '.join(sorted(KV_EVENT_ENGINES))}, not {self.engine.value}'s")
        if not self.levers.prefix_caching:
            raise ValueError("kv_events: the engines publish what their prefix cache stores "
                             "and evicts: it needs levers.prefix_caching: true")
        if events.addresses is None:
            _check_event_ports(events, self.endpoints)
            return self
        if self.resolve == "dns":
            raise ValueError("kv_events.addresses name one engine per listed endpoint, but a "
                             "resolve: dns pool's engines are the addresses its names resolve "
                             "to: leave addresses out (each address then publishes on port)")
        for name in ("addresses", "replay_addresses"):
            listed = getattr(events, name)
            if listed is not None and len(listed) != len(self.endpoints):
                raise ValueError(f"kv_events.{name}: one per endpoint ({len(self.endpoints)}),"
                                 f" not {len(listed)}")
        return self

    def kv_event_sources(self, urls: Iterable[str] | None = None) -> dict[str, KvEventSource]:
        """Endpoint URL → where its engine publishes KV-cache events ({} without
        ``kv_events``). ``urls``: the endpoint URLs as the registry has them now (for a
        ``resolve: dns`` pool, the resolved ones); None = :meth:`endpoint_urls`."""
        events = self.kv_events
        if events is None:
            return {}
        declared = self.endpoint_urls()
        index = {url: i for i, url in enumerate(declared)}
        chosen = declared if urls is None else list(urls)
        return {url: events.source(url, index.get(url)) for url in chosen}

    def host_kv_mechanism(self) -> HostKvMechanism | None:
        """The mechanism of the pool's host KV tier (the engine's default when the file names
        none); None without a host tier."""
        tier = self.levers.host_kv_cache
        if tier is None:
            return None
        return tier.mechanism or HOST_KV_MECHANISMS[self.engine][0]

    @field_validator("endpoints")
    @classmethod
    def _distinct(cls, value: list[AnyHttpUrl]) -> list[AnyHttpUrl]:
        urls = [str(u) for u in value]
        if len(set(urls)) != len(urls):
            raise ValueError("endpoint listed twice")
        return value

    @model_validator(mode="after")
    def _ngram_acceptance_from_text(self) -> Pool:
        spec = self.levers.speculative
        given = {"acceptance_rate", "acceptance_by_position"} & self.simulator.model_fields_set
        if spec is not None and spec.method == "ngram" and given:
            raise ValueError(f"simulator.{sorted(given)[0]}: an n-gram pool's acceptance is "
                             "computed from each request's text (drafts looked up in the "
                             "prompt); remove it")
        return self

    @model_validator(mode="after")
    def _resolvable(self) -> Pool:
        if self.resolve == "dns" and any(u.scheme == "https" for u in self.endpoints):
            raise ValueError("resolve: dns connects to each address the name resolves to, "
                             "which a TLS certificate issued for the name does not cover: "
                             "use http endpoints with it")
        return self

    @field_validator("model", mode="wrap")
    @classmethod
    def _model_by_name(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        raw, given = model_input(value)
        facts = handler(raw)
        if given is None or facts is None:
            return facts
        # set = the name and what the file wrote: the catalogue's values claim nothing about the
        # engines, and a dump of the set fields (``ridge render``) names the model again
        return ModelFacts.model_construct(_fields_set=given, **facts.model_dump())

    @field_validator("hardware", mode="before")
    @classmethod
    def _hardware_by_name(cls, value: Any) -> Any:
        return hardware_input(value)

    def endpoint_urls(self) -> list[str]:
        """Base URLs without a trailing slash."""
        return [str(u).rstrip("/") for u in self.endpoints]

    def adapter_names(self) -> tuple[str, ...]:
        """The names of the pool's declared LoRA adapters, in file order."""
        return tuple(a.name for a in self.adapters)

    def max_lora_rank(self) -> int | None:
        """The engine's LoRA rank bound: the smallest of :data:`LORA_RANKS` at least the
        largest declared adapter ``rank``; None when no adapter declares one."""
        ranks = [a.rank for a in self.adapters if a.rank is not None]
        if not ranks:
            return None
        return next(r for r in LORA_RANKS if r >= max(ranks))

    def missing_facts(self) -> tuple[str, ...]:
        """Which of ``model`` and ``hardware`` this pool has no facts for (in that order)."""
        return tuple(key for key, facts in (("model", self.model), ("hardware", self.hardware))
                     if facts is None)


def _check_event_ports(events: KvEvents, endpoints: list[AnyHttpUrl]) -> None:
    """Without explicit addresses each engine publishes on its endpoint's host: no two
    endpoints share a host, and the event ports are not an endpoint's HTTP port."""
    hosts = [u.host for u in endpoints]
    shared = sorted({h for h in hosts if h is not None and hosts.count(h) > 1})
    if shared:
        raise ValueError(f"kv_events: endpoints share the host {shared[0]}, whose engines "
                         "cannot all publish on one port: list kv_events.addresses, one per "
                         "endpoint")
    taken = {u.port for u in endpoints}
    clash = sorted(p for p in events.ports().values() if p in taken)
    if clash:
        raise ValueError(f"kv_events: port {clash[0]} is also an endpoint's HTTP port, on "
                         "the same host")


def pool_levers(pool: Pool) -> frozenset[str]:
    """The pool's levers by name (see ``routing.snapshots.LEVERS``)."""
    on = {
        PREFIX_CACHE: pool.levers.prefix_caching,
        CHUNKED_PREFILL: bool(pool.levers.chunked_prefill and pool.levers.chunked_prefill.enabled),
        SPECULATIVE: pool.levers.speculative is not None,
        PD_DISAGGREGATION: pool.role is not Role.MIXED,
        FP8_KV_CACHE: pool.levers.kv_dtype_bytes is not None,
        HOST_KV_CACHE: pool.levers.host_kv_cache is not None,
    }
    return frozenset(name for name, enabled in on.items() if enabled)
