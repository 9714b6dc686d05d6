"""The fleet file: pools of engines, their levers, and the model and hardware facts.

One YAML file declares the whole fleet. The gateway routes over it, the simulator starts it,
and the deploy renderer turns each pool's levers into engine launch flags. Loading a bad file
raises :class:`FleetConfigError`, whose message names the file, the field and the problem.

Launching: a pool's ``checkpoint`` (what its engines load; default its first model name) and
``engine_args`` (more engine flags, appended verbatim) feed the rendered launch commands
(:mod:`backends.launch.recipes`, ``ridge render``); the renderer refuses engine arguments that
would contradict the pool's levers.

LoRA adapters: a pool's ``adapters`` (:class:`Adapter`: a name, optionally the path its engines
load it from and its rank) are served names on top of the pool's base model; they render into
the engines' LoRA flags, and the router sends a request naming one only to endpoints that have
it (:mod:`routing.scheduler.plugins.adapter_affinity`). An adapter's name is no base model's.

Capacity levers: a pool's ``levers.kv_cache_dtype`` (``auto`` | ``fp8`` | ``fp8_e4m3`` |
``fp8_e5m2``; 8-bit KV elements hold twice the tokens of a 16-bit model's in the same bytes)
and ``levers.host_kv_cache`` (:class:`HostKvCache`: ``size_gb`` of host memory per engine and
the engine's ``mechanism``: vLLM ``native`` or ``lmcache``, SGLang ``hicache``; SGLang takes
whole GB; needs ``prefix_caching``); a prefill pool and its decode pool share one
``kv_cache_dtype`` (the KV crosses as stored). They render into the engines' flags and the
simulator models them; the host link's bandwidth is the hardware fact ``host_link_bandwidth`` [B/s].

Routing settings: ``routing.policy`` holds the lever policy's thresholds and rule order
(:class:`routing.policy.PolicyConfig`); ``routing.scheduler`` the replica scheduler every pool
uses unless the pool has its own ``scheduler`` (:class:`routing.scheduler.SchedulerConfig`).
Plugin and rule names are checked against routing's tables here, at load, so a typo stops
start-up instead of a request. The routing types stay plain dataclasses; ``to_config``
converts at this boundary.

Endpoints that change at runtime: a pool with ``resolve: dns`` is, for the registry, one
endpoint per address its endpoints' host names resolve to, looked up again at every poll
(:mod:`backends.registry.resolver`); only ``http`` endpoints may take it (a certificate issued for
the
name does not cover the addresses).

KV-cache events: a pool's ``kv_events`` (:class:`KvEvents`) says where its engines publish
what they store in and evict from their prefix cache (vLLM's and SGLang's
``--kv-events-config``: a ZMQ PUB socket on ``port``, an optional replay socket on
``replay_port``, a ``topic``), rendered into the engines' flags; the gateway subscribes to each
endpoint's stream (:mod:`backends.kv_events.subscriber`) at the address
:meth:`Pool.kv_event_sources`
gives: the endpoint URL's host with those ports, or, where several engines share a host, the
pool's explicit ``addresses`` (one per endpoint, with ``replay_addresses`` likewise), and
decodes it in its engine's wire format (:data:`KV_EVENT_ENGINES`: vLLM and SGLang). It needs
``prefix_caching`` (an engine publishes nothing without its prefix cache). A ``resolve: dns``
pool takes it without explicit addresses: each resolved address is the host of its engine's
stream.

Service-level objectives: ``slos`` maps a model name (or ``*``, every other model) to its
bounds ``ttft_s`` / ``tpot_s`` / ``e2e_s`` [s] and optional request ``classes`` (chosen by the
client's ``x-ridge-slo-class`` header or by ``max_tokens`` band); the rules, and the
conversion of this section into them, are in :mod:`gateway.telemetry.slos`.

Model and hardware facts: a pool's ``model:`` and ``hardware:`` each take one of three forms.
(a) A name from the built-in catalogue (:mod:`config.builtin_facts`, case-insensitive, with
aliases):
``model: llama-3-8b``, ``hardware: nvidia-h100-sxm``; a mapping with a ``name`` that lacks
some required fields takes the catalogue's facts with the fields it gives overridden
(``hardware: {name: nvidia-l4, kv_cache_bytes: 6e9}``). (b) Full facts (:class:`ModelFacts`,
:class:`HardwareFacts`): a mapping with every required field is taken as written, whatever its
``name`` says, as before. (c) Absent: the pool routes as any other, but its MFU/MBU is off (the
telemetry says so once at start-up, :mod:`gateway.telemetry.efficiency`), its ridge point is
unknown (the
lever policy's speculative rule admits no pool without one), and the simulator refuses it.
Names are resolved here, at load: past this module a pool's facts are :class:`ModelFacts` /
:class:`HardwareFacts` or None. A model named from the catalogue claims nothing about how its
engines were launched: only its ``name`` and the fields the file writes count as set
(``model_fields_set``; the lever check compares ``max_context`` only when the file sets it),
so a dump of the set fields names it again.
Facts become the fleet arithmetic's plain dataclasses at this boundary:
:meth:`ModelFacts.to_shape` and :meth:`HardwareFacts.to_rates` (:mod:`routing.formulas`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal, NamedTuple
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from config.builtin_facts import (
    UnknownName,
    accelerator_name,
    find_accelerator,
    find_model,
    model_name,
)
from routing.features import DEFAULT_BLOCK_TOKENS, DEFAULT_OUTPUT_TOKENS
from routing.formulas import HardwareRates, ModelShape
from routing.policy import DEFAULT_RULES, PolicyConfig
from routing.scheduler.catalog import SchedulerConfigError, validate
from routing.scheduler.framework import PluginSpec, SchedulerConfig
from routing.snapshots import (
    CHUNKED_PREFILL,
    FP8_KV_CACHE,
    HOST_KV_CACHE,
    PD_DISAGGREGATION,
    PREFIX_CACHE,
    SPECULATIVE,
)
from routing.tokens.counters import CHARS_PER_TOKEN

PositiveFloat = Annotated[float, Field(gt=0)]
PositiveInt = Annotated[int, Field(gt=0)]

ANY_MODEL = "*"
"""The ``slos`` key of every model without an entry of its own."""
DEFAULT_CLASS = "default"
"""The SLO class of a request no class covers (so no class may take this name)."""


class Engine(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"


class Role(StrEnum):
    MIXED = "mixed"
    PREFILL = "prefill"
    DECODE = "decode"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ChunkedPrefill(_Strict):
    """Chunked prefill: long prompts split into chunks of at most ``token_budget`` tokens a
    step."""

    enabled: bool = True
    token_budget: PositiveInt = 2048


class Speculative(_Strict):
    """Speculative decoding: ``num_draft_tokens`` (K) drafted per verify step by ``method``."""

    method: Literal["ngram", "eagle", "eagle3", "medusa", "mtp", "draft_model"] = "ngram"
    num_draft_tokens: PositiveInt = 4
    draft_model: str | None = None


KvCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]
"""The KV cache's element type: ``auto`` (the model's dtype) or an 8-bit float. ``fp8`` is
vLLM's name for ``fp8_e4m3``; both engines take ``fp8_e4m3`` and ``fp8_e5m2`` (vLLM 0.32
``CacheDType``, SGLang ``--kv-cache-dtype`` choices)."""

KV_CACHE_DTYPE_BYTES: Mapping[str, float | None] = MappingProxyType(
    {"auto": None, "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0}
)
"""``kv_cache_dtype`` → bytes per KV element [B]; None = the model's ``dtype_bytes``."""

HostKvMechanism = Literal["native", "lmcache", "hicache"]

HOST_KV_MECHANISMS: Mapping[Engine, tuple[HostKvMechanism, ...]] = MappingProxyType({
    Engine.VLLM: ("native", "lmcache"),
    Engine.SGLANG: ("hicache",),
})  # fmt: skip
"""The host-tier mechanisms each engine offers, its default first: vLLM's
``--kv-offloading-backend`` (``native`` CPU offloading, ``lmcache``), SGLang's hierarchical
cache (``hicache``)."""

GB = 1e9
"""Bytes per GB (decimal, as SGLang's ``--hicache-size``; vLLM's ``--kv-offloading-size`` is
in GiB = 2**30 B)."""


class HostKvCache(_Strict):
    """A host-memory (CPU DRAM) tier of the KV cache, per engine: prefix-cache blocks evicted
    from device memory stay there (up to ``size_gb``) and a later prefix hit reloads them over
    the host link instead of recomputing them. ``size_gb``: host memory for KV [GB = 1e9 B];
    ``mechanism``: how the engine does it (:data:`HOST_KV_MECHANISMS`; None = the engine's
    default, ``native`` for vLLM, ``hicache`` for SGLang)."""

    size_gb: PositiveFloat
    mechanism: HostKvMechanism | None = None

    @property
    def size_bytes(self) -> float:
        """Host memory for KV [B] = size_gb · 1e9."""
        return self.size_gb * GB


class Levers(_Strict):
    """The engine configuration a pool was launched with: what it relaxes, not how it is routed.

    Capacity levers: ``kv_cache_dtype`` (:data:`KvCacheDtype`; an 8-bit type halves the KV
    bytes per token of a 16-bit model, so its KV cache holds twice the tokens) and
    ``host_kv_cache`` (:class:`HostKvCache`; needs ``prefix_caching``: the tier holds prefix
    blocks for reuse)."""

    prefix_caching: bool = False
    chunked_prefill: ChunkedPrefill | None = None
    speculative: Speculative | None = None
    kv_cache_dtype: KvCacheDtype = "auto"
    host_kv_cache: HostKvCache | None = None

    @model_validator(mode="after")
    def _host_tier_needs_prefix_caching(self) -> Levers:
        if self.host_kv_cache is not None and not self.prefix_caching:
            raise ValueError("host_kv_cache holds prefix-cache blocks for reuse: it needs "
                             "prefix_caching: true")
        return self

    @property
    def kv_dtype_bytes(self) -> float | None:
        """Bytes per KV element of ``kv_cache_dtype`` [B]; None = the model's dtype."""
        return KV_CACHE_DTYPE_BYTES[self.kv_cache_dtype]


class ModelFacts(_Strict):
    """The served model's shape. Units: counts, and bytes per element for ``dtype_bytes``."""

    name: str | None = Field(default=None, description="a label; the catalogue's name when the "
                             "facts come from config.builtin_facts")
    params: PositiveFloat = Field(description="parameter count N")
    layers: PositiveInt
    hidden_size: PositiveInt
    kv_heads: PositiveInt
    head_dim: PositiveInt
    dtype_bytes: PositiveFloat = Field(description="bytes per weight / KV element (fp16 = 2)")
    max_context: PositiveInt = 4096

    def to_shape(self, kv_dtype_bytes: float | None = None) -> ModelShape:
        """The shape the fleet arithmetic takes; ``kv_dtype_bytes`` None = ``dtype_bytes``."""
        return ModelShape(self.params, self.layers, self.hidden_size, self.kv_heads,
                          self.head_dim, self.dtype_bytes, kv_dtype_bytes)


class HardwareFacts(_Strict):
    """One accelerator's peak rates. Units: FLOP/s and bytes/s."""

    name: str = "unknown"
    peak_flops: PositiveFloat = Field(description="peak dense FLOP/s")
    mem_bandwidth: PositiveFloat = Field(description="memory bandwidth in bytes/s")
    kv_cache_bytes: PositiveFloat | None = Field(
        default=None, description="bytes of KV cache per engine; None = engine default"
    )
    host_link_bandwidth: PositiveFloat = Field(
        default=25e9, description="bytes/s between host memory and the accelerator, for a "
        "host KV tier's reloads; default PCIe Gen4 x16's ~25 GB/s effective (32 GB/s raw)"
    )

    def to_rates(self) -> HardwareRates:
        """The peak rates the fleet arithmetic takes."""
        return HardwareRates(self.peak_flops, self.mem_bandwidth)


class SimulatorKnobs(_Strict):
    """Settings only the simulator reads: how this pool behaves when simulated."""

    step_overhead_s: float = Field(default=0.0, ge=0)
    acceptance_rate: float = Field(
        default=0.7, ge=0, lt=1,
        description="draft-model speculation (eagle, medusa, mtp, draft_model): the chance each "
        "draft is accepted once those before it were; n-gram acceptance comes from the text",
    )
    acceptance_by_position: list[Annotated[float, Field(ge=0, lt=1)]] | None = Field(
        default=None, min_length=1,
        description="draft-model speculation: that chance per draft position (the last value "
        "repeats); replaces acceptance_rate",
    )
    copy_slip: float = Field(
        default=0.0, ge=0, lt=1,
        description="the chance a copied token of a 'repeat this' answer is a fresh word "
        "instead (a model's imperfect copy; see backends.sim.answers)",
    )
    repeat_share: float = Field(
        default=0.0, ge=0, lt=1,
        description="the share of free-text answer tokens that repeat earlier text of the "
        "sequence (prompt or answer), as models repeat themselves; see backends.sim.answers",
    )
    repeat_run_tokens: float = Field(
        default=6.0, ge=1, description="the mean length of such a repeat [tokens]"
    )
    repeat_after_tokens: int = Field(
        default=0, ge=0, description="answer tokens before the model starts repeating itself"
    )
    draft_cost: float | None = Field(
        default=None, ge=0,
        description="drafting time per draft token, as a fraction of a decode step; None = 0 "
        "for n-gram (a look-up in the sequence, no model to run), 0.05 for the other methods",
    )
    kv_link_bandwidth: PositiveFloat = 50e9
    seed: int = 0
    profile: str | None = Field(
        default=None,
        description="a hardware profile of backends.sim.profiles (calibrated overheads, memory); "
        "None = the one hardware.name names; a name that is no profile stops the simulator "
        "('generic-gpu': generic GPU overheads, asked for)",
    )
    mean_output_tokens: PositiveFloat | None = Field(
        default=None,
        description="mean of a sampled natural stop length (finish_reason stop); None = always "
        "generate max_tokens",
    )


_POLICY = PolicyConfig()
_SCHEDULER = SchedulerConfig()
Fraction = Annotated[float, Field(ge=0, le=1)]


class SchedulerSettings(_Strict):
    """How a pool picks a replica: ``filters`` → ``scorers`` (name: weight) → ``picker``, by
    plugin instance name (:mod:`routing.scheduler.catalog`: a name declared under
    ``routing.plugins``, or a plugin type with its default parameters). Every scorer needs a
    weight > 0. The names are checked when the whole fleet is validated."""

    filters: list[str] = Field(default_factory=lambda: list(_SCHEDULER.filters))
    scorers: dict[str, PositiveFloat] = Field(default_factory=lambda: dict(_SCHEDULER.scorers))
    picker: str = _SCHEDULER.picker
    seed: int = Field(default=_SCHEDULER.seed, description="for pickers that draw at random")

    @field_validator("scorers", mode="before")
    @classmethod
    def _weighted(cls, value: Any) -> Any:
        if isinstance(value, list):
            raise ValueError("every scorer needs a weight: write a mapping such as "
                             "{cache_aware: 1}, not a list")
        if isinstance(value, dict):
            for name, weight in value.items():
                if weight is None:
                    raise ValueError(f"scorer {name!r} has no weight")
        return value

    def to_config(self, plugins: tuple[PluginSpec, ...] = ()) -> SchedulerConfig:
        return SchedulerConfig(tuple(self.filters), tuple(self.scorers.items()), self.picker,
                               self.seed, plugins)


class PluginSettings(_Strict):
    """A named scheduler plugin instance: ``type`` is a plugin of the catalog, ``parameters``
    its keyword arguments (documented in the plugin's module)."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=64)]
    type: str
    parameters: dict[str, Any] = Field(default_factory=dict)

    def to_spec(self) -> PluginSpec:
        return PluginSpec(self.name, self.type, dict(self.parameters))


class TokenizerSettings(_Strict):
    """One model's files for exact prompt tokens (:mod:`routing.tokens.exact`): ``path``, its
    Hugging Face ``tokenizer.json`` or the model folder holding it (its
    ``tokenizer_config.json`` and chat template are read from the same folder);
    ``chat_template``, a Jinja file used instead of the folder's (as vLLM's
    ``--chat-template``); ``content_format`` as vLLM's ``--chat-template-content-format``;
    ``required``: false lets a model whose files cannot be loaded fall back to the estimate
    (logged at start-up) instead of stopping it. A plain string stands for ``path``. Paths may
    name environment variables (``$NAME``, ``${NAME}``, ``${NAME:-default}``); a relative path
    (after them) is relative to the fleet file."""

    path: str
    chat_template: str | None = None
    content_format: Literal["auto", "string", "openai"] = "auto"
    required: bool = True


class FeatureSettings(_Strict):
    """How the router measures a request (:mod:`routing.features`): ``block_tokens`` per
    hashed prompt block, ``chars_per_token`` of the estimate, ``default_output_tokens`` when
    neither ``max_tokens`` nor a learned mean is known, and ``tokenizers``: model name → its
    tokenizer and chat template (:class:`TokenizerSettings`) for exact prompt token counts
    (needs ``pip install 'ridge[tokenizers]'``)."""

    block_tokens: PositiveInt = DEFAULT_BLOCK_TOKENS
    chars_per_token: PositiveFloat = CHARS_PER_TOKEN
    default_output_tokens: PositiveInt = DEFAULT_OUTPUT_TOKENS
    tokenizers: dict[str, TokenizerSettings] = Field(default_factory=dict)

    @field_validator("tokenizers", mode="before")
    @classmethod
    def _paths_alone(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {m: {"path": v} if isinstance(v, str) else v for m, v in value.items()}
        return value


class PolicySettings(_Strict):
    """The lever policy's thresholds and rule order; see :mod:`routing.policy` for each rule.
    Units: tokens, blocks, requests (per healthy endpoint), fractions in [0, 1]."""

    long_prompt_tokens: PositiveInt = _POLICY.long_prompt_tokens
    busy_load_per_endpoint: float = Field(default=_POLICY.busy_load_per_endpoint, ge=0)
    high_prefix_share: Fraction = _POLICY.high_prefix_share
    long_match_blocks: PositiveInt = _POLICY.long_match_blocks
    long_match_fraction: Fraction = _POLICY.long_match_fraction
    decode_heavy_ratio: float = Field(default=_POLICY.decode_heavy_ratio, ge=0)
    spec_max_ridge_fraction: float = Field(default=_POLICY.spec_max_ridge_fraction, gt=0, le=1)
    idle_spec_fraction: Fraction = Field(
        default=_POLICY.idle_spec_fraction,
        description="ordinary requests use a speculative pool while its decode batch is below "
        "this share of the spec rule's cap (0 = never; 1 = as long as decode-heavy ones)",
    )
    idle_spec_margin: float = Field(
        default=_POLICY.idle_spec_margin, ge=0,
        description="... and while the least-loaded general pool holds this many more requests "
        "per healthy endpoint than it does",
    )
    saturated_queue_per_endpoint: PositiveFloat = _POLICY.saturated_queue_per_endpoint
    long_context_tokens: PositiveInt = Field(
        default=_POLICY.long_context_tokens,
        description="a prompt of this many tokens goes to a pool with a capacity lever "
        "(host KV tier, fp8 KV) when one serves the model",
    )
    capacity_cost_ratio: float = Field(
        default=_POLICY.capacity_cost_ratio, gt=0,
        description="... while that pool's cache cost is at most this many times the other "
        "prefix-caching pools'",
    )
    rules: list[str] = Field(
        default_factory=lambda: list(_POLICY.rules),
        description="rule names in the order tried; a rule left out is off",
    )

    @field_validator("rules")
    @classmethod
    def _known_rules(cls, value: list[str]) -> list[str]:
        known = [r.name for r in DEFAULT_RULES]
        unknown = [n for n in value if n not in known]
        if unknown:
            raise ValueError(f"unknown rules {unknown}; known: {', '.join(known)}")
        if len(set(value)) != len(value):
            raise ValueError("a rule is listed twice")
        return value

    def to_config(self) -> PolicyConfig:
        fields = self.model_dump(exclude={"rules"})
        return PolicyConfig(**fields, rules=tuple(self.rules))


class RoutingSettings(_Strict):
    """Fleet-wide routing: the lever policy, the scheduler of pools without their own, the
    named plugin instances every scheduler may use, and how requests are measured."""

    policy: PolicySettings = PolicySettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    plugins: list[PluginSettings] = Field(default_factory=list)
    features: FeatureSettings = FeatureSettings()


class SloBoundsSettings(_Strict):
    """Upper bounds [s] of one SLO: time to first token, per output token, end to end."""

    ttft_s: PositiveFloat | None = None
    tpot_s: PositiveFloat | None = None
    e2e_s: PositiveFloat | None = None


class SloClassSettings(SloBoundsSettings):
    """A request class of a model's SLO. ``min_max_tokens``: the class covers requests asking
    for at least that many output tokens (the highest band that fits wins); None = only when
    the client names the class in ``x-ridge-slo-class``. Unset bounds come from the model."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=32)]
    min_max_tokens: int | None = Field(default=None, ge=0)


class ModelSloSettings(SloBoundsSettings):
    """One model's SLO: its bounds and optional request classes."""

    classes: list[SloClassSettings] = Field(default_factory=list)

    @field_validator("classes")
    @classmethod
    def _distinct_classes(cls, value: list[SloClassSettings]) -> list[SloClassSettings]:
        names = [c.name for c in value]
        if len(set(names)) != len(names) or DEFAULT_CLASS in names:
            raise ValueError(f"class names must be unique and not {DEFAULT_CLASS!r}: {names}")
        return value


LORA_RANKS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The LoRA ranks an engine can be sized for (vLLM 0.32 ``--max-lora-rank`` choices,
``vllm/config/lora.py`` ``MaxLoRARanks``); a declared ``rank`` is rounded up to one of them."""


class Adapter(_Strict):
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


Port = Annotated[int, Field(ge=1, le=65535)]
TCP_ADDRESS = r"^tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})$"
"""A ZMQ address a subscriber connects to: ``tcp://HOST:PORT`` (an IPv6 host in brackets)."""
TcpAddress = Annotated[str, Field(pattern=TCP_ADDRESS)]

KV_EVENT_ENGINES: frozenset[Engine] = frozenset({Engine.VLLM, Engine.SGLANG})
"""Engines whose KV-cache events ridge decodes: exactly those with a wire format in
:data:`backends.kv_events.wire.WIRE_FORMATS` (a test holds the two equal; vLLM 0.32; SGLang 0.5.23, whose pages may be
smaller than ridge's router blocks: :mod:`routing.kv_events.index` accumulates them)."""


class KvEventSource(NamedTuple):
    """Where one engine publishes its KV-cache events: ``publish``, its PUB socket's address;
    ``replay``, its replay (ROUTER) socket's, None without one; ``topic``, the stream's topic."""

    publish: str
    replay: str | None
    topic: str


def tcp_address(host: str, port: int) -> str:
    """``tcp://host:port``, an IPv6 host in brackets."""
    bare = host.strip("[]")
    return f"tcp://[{bare}]:{port}" if ":" in bare else f"tcp://{bare}:{port}"


class KvEvents(_Strict):
    """The engines' KV-cache event streams (``--kv-events-config``, ZMQ): ``port``, the
    PUB socket's port on each engine's host; ``replay_port``, its replay socket's (None = no
    replay: a missed batch then costs the router what it knew of that engine); ``topic``;
    ``addresses`` / ``replay_addresses``: explicit ``tcp://HOST:PORT`` addresses, one per
    endpoint in order, instead of each endpoint's host with the ports (engines sharing a host
    publish on ports of their own; a rendered engine binds ``port`` and ``replay_port`` unless
    given its own, :func:`backends.launch.vllm.engine_event_ports`)."""

    port: Port
    replay_port: Port | None = None
    topic: str = ""
    addresses: list[TcpAddress] | None = None
    replay_addresses: list[TcpAddress] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> KvEvents:
        if self.replay_port == self.port:
            raise ValueError("replay_port must differ from port (two sockets, one port each)")
        if self.replay_addresses is not None and self.addresses is None:
            raise ValueError("replay_addresses go with addresses (one of each per endpoint)")
        for name in ("addresses", "replay_addresses"):
            listed = getattr(self, name) or []
            if len(set(listed)) != len(listed):
                raise ValueError(f"{name}: an address listed twice")
            wrong = [a for a in listed if not 1 <= address_port(a) <= 65535]
            if wrong:
                raise ValueError(f"{name}: {wrong[0]} has no port from 1 to 65535")
        return self

    def source(self, url: str, index: int | None) -> KvEventSource:
        """The stream of the engine at endpoint ``url`` (``index``: its place among the
        pool's endpoints, None for an address a ``resolve: dns`` name resolved to)."""
        if self.addresses is None:
            host = urlsplit(url).hostname
            if not host:
                raise ValueError(f"endpoint {url!r} names no host")
            return KvEventSource(tcp_address(host, self.port), self._replay_on(host), self.topic)
        if index is None:
            raise ValueError(f"{url!r} is not one of the pool's endpoints, whose KV event "
                             "addresses the fleet file lists")
        publish = self.addresses[index]
        replay = (self.replay_addresses[index] if self.replay_addresses is not None
                  else self._replay_on(_address_host(publish)))
        return KvEventSource(publish, replay, self.topic)

    def _replay_on(self, host: str) -> str | None:
        return None if self.replay_port is None else tcp_address(host, self.replay_port)

    def ports(self) -> dict[str, int]:
        """The ports the engines listen on for the streams, by name (``kv-events``,
        ``kv-replay``)."""
        named = {"kv-events": self.port, "kv-replay": self.replay_port}
        return {name: port for name, port in named.items() if port is not None}


def _address_host(address: str) -> str:
    return _address_parts(address).group(1)


def address_port(address: str) -> int:
    """The port of a ``tcp://HOST:PORT`` address."""
    return int(_address_parts(address).group(2))


def _address_parts(address: str) -> re.Match[str]:
    match = re.match(TCP_ADDRESS, address)
    if match is None:
        raise ValueError(f"not a tcp://HOST:PORT address: {address!r}")
    return match


class Pool(_Strict):
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
        raw, given = _model_input(value)
        facts = handler(raw)
        if given is None or facts is None:
            return facts
        # set = the name and what the file wrote: the catalogue's values claim nothing about the
        # engines, and a dump of the set fields (``ridge render``) names the model again
        return ModelFacts.model_construct(_fields_set=given, **facts.model_dump())

    @field_validator("hardware", mode="before")
    @classmethod
    def _hardware_by_name(cls, value: Any) -> Any:
        return _hardware_input(value)

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


_MODEL_FIELDS = frozenset({"params", "layers", "hidden_size", "kv_heads", "head_dim",
                           "dtype_bytes"})
_RATES = frozenset({"peak_flops", "mem_bandwidth"})


def _model_input(value: Any) -> tuple[Any, set[str] | None]:
    """``model:`` as ModelFacts validates it, and the keys the file set when it named a
    catalogue model (None when it did not): a name alone, or a mapping with a ``name`` that
    lacks some of the shape's fields, takes the rest from the catalogue."""
    if isinstance(value, str):
        value = {"name": value}
    if isinstance(value, dict) and "name" in value and not value.keys() >= _MODEL_FIELDS:
        name = _catalogue_name(model_name, value["name"], "the full facts")
        given = {k: v for k, v in value.items() if k != "name"}
        return {**find_model(name).facts(), **given, "name": name}, {"name", *given}
    return value, None


def _hardware_input(value: Any) -> Any:
    """``hardware:`` as HardwareFacts validates it: a name alone, or a mapping with a ``name``
    and without both rates, takes the rest from the catalogue."""
    if isinstance(value, str):
        value = {"name": value}
    if isinstance(value, dict) and "name" in value and not value.keys() >= _RATES:
        name = _catalogue_name(accelerator_name, value["name"],
                               "both peak_flops and mem_bandwidth")
        return {**find_accelerator(name).facts(), **value, "name": name}
    return value


def _catalogue_name(lookup: Callable[[str], str], name: Any, instead: str) -> str:
    try:
        return lookup(str(name))
    except UnknownName as exc:
        raise ValueError(f"{exc}; or give {instead}") from None


class Fleet(_Strict):
    """The whole fleet: every pool ridge may route to."""

    pools: Annotated[list[Pool], Field(min_length=1)]
    routing: RoutingSettings = RoutingSettings()
    slos: dict[str, ModelSloSettings] = Field(
        default_factory=dict, description="SLO per model name; '*' = every other model"
    )

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


class FleetConfigError(ValueError):
    """A fleet file that cannot be used; the message names the file, the field and the problem."""


def load_fleet(path: str | Path) -> Fleet:
    """Read and validate a fleet file."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise FleetConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
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
