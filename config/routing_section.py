"""The fleet file's ``routing:`` section: fleet-wide routing settings (:class:`RoutingSettings`).

``policy`` holds the lever policy's thresholds and rule order (:class:`PolicySettings` →
:class:`routing.policy.PolicyConfig`); ``scheduler`` the replica scheduler of every pool
without its own (:class:`SchedulerSettings` → :class:`routing.scheduler.SchedulerConfig`);
``plugins`` the named scheduler plugin instances (:class:`PluginSettings`); ``features`` how a
request is measured, with tokenizer files per model (:class:`FeatureSettings`,
:class:`TokenizerSettings`). Defaults are routing's own. Rule names are checked here, plugin
names and tokenizer models against the whole fleet (:mod:`config.fleet`), all at load, so a
typo stops start-up instead of a request. The routing types stay plain dataclasses;
``to_config`` / ``to_spec`` convert at this boundary. See docs/fleet-file.md.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from config.strict import PositiveFloat, PositiveInt, Strict
from routing.features import DEFAULT_BLOCK_TOKENS, DEFAULT_OUTPUT_TOKENS
from routing.policy import DEFAULT_RULES, PolicyConfig
from routing.scheduler.framework import PluginSpec, SchedulerConfig
from routing.tokens.counters import CHARS_PER_TOKEN

_POLICY = PolicyConfig()
_SCHEDULER = SchedulerConfig()
Fraction = Annotated[float, Field(ge=0, le=1)]


class SchedulerSettings(Strict):
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


class PluginSettings(Strict):
    """A named scheduler plugin instance: ``type`` is a plugin of the catalog, ``parameters``
    its keyword arguments (documented in the plugin's module)."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=64)]
    type: str
    parameters: dict[str, Any] = Field(default_factory=dict)

    def to_spec(self) -> PluginSpec:
        return PluginSpec(self.name, self.type, dict(self.parameters))


class TokenizerSettings(Strict):
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


class FeatureSettings(Strict):
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


class PolicySettings(Strict):
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


class RoutingSettings(Strict):
    """Fleet-wide routing: the lever policy, the scheduler of pools without their own, the
    named plugin instances every scheduler may use, and how requests are measured."""

    policy: PolicySettings = PolicySettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    plugins: list[PluginSettings] = Field(default_factory=list)
    features: FeatureSettings = FeatureSettings()
