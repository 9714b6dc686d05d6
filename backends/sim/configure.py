"""From a pool of the fleet file to the settings of one simulated engine.

:func:`engine_config` needs the pool's ``model`` and ``hardware`` facts (else
:class:`~config.fleet.FleetConfigError`) and derives, in order: the device, calibrated by a
hardware profile (:func:`profile_for`: ``simulator.profile``, else one named by
``hardware.name`` or another catalogue name of that accelerator; never a silent fall-back); the
KV cache [B] and its blocks (:func:`kv_cache_bytes`; fewer than ``max_context`` tokens is an
error, as for vLLM); the capacity levers (``kv_cache_dtype`` fp8 halves a 16-bit model's KV
bytes per token; ``host_kv_cache`` gives a host tier, :func:`host_blocks`, with
:data:`HOST_LARGER` engines refusing one not larger than the device's); the token budget per
step; and speculative decoding (n-gram drafts looked up in the request's own text, other
methods by their acceptance, drafts costing ``simulator.draft_cost`` or
:data:`DRAFT_MODEL_COST`). See docs/simulator.md#from-a-pool-to-an-engine.
"""

from __future__ import annotations

from backends.engines.kv_capacity import engine_kv_bytes
from backends.launch.vllm import NGRAM_LOOKUP
from backends.sim.behaviour import DIALECTS, Dialect
from backends.sim.device import Device, Overheads
from backends.sim.engine import EngineConfig
from backends.sim.kvcache import host_tier_blocks
from backends.sim.profiles import GENERIC, HARDWARE, HardwareProfile
from backends.sim.scheduler import EngineSchedulerConfig
from config.builtin_facts import accelerator_names
from config.engines import Engine
from config.facts import HardwareFacts, ModelFacts
from config.fleet import FleetConfigError
from config.pools import Pool

HOST_LARGER: frozenset[Engine] = frozenset({Engine.SGLANG})
"""Engines whose host KV tier must hold more tokens than the device pool (SGLang's
``HostKVCache`` asserts it: "The host memory should be larger than the device memory")."""


def facts_of(pool: Pool) -> tuple[ModelFacts, HardwareFacts]:
    """The pool's model and hardware facts; FleetConfigError when it lacks either."""
    if pool.model is None or pool.hardware is None:
        raise FleetConfigError(
            f"pool {pool.name!r} cannot be simulated: the fleet file gives no "
            f"{' and no '.join(pool.missing_facts())} facts (a catalogue name such as "
            "'model: llama-3-8b' / 'hardware: nvidia-l4', or full facts)"
        )
    return pool.model, pool.hardware


def profile_for(pool: Pool) -> HardwareProfile:
    """The calibration profile of ``pool``; FleetConfigError for a name that is no profile (see
    the module docstring)."""
    known = ", ".join(sorted(HARDWARE))
    if pool.simulator.profile is not None:
        asked = pool.simulator.profile
        if asked.strip().lower() in HARDWARE:
            return HARDWARE[asked.strip().lower()]
        raise FleetConfigError(
            f"pool {pool.name!r}: simulator.profile {asked!r} is not a hardware profile of the "
            f"simulator; known profiles: {known}"
        )
    name = facts_of(pool)[1].name
    for candidate in (name.strip().lower(), *accelerator_names(name)):
        if candidate in HARDWARE:
            return HARDWARE[candidate]
    raise FleetConfigError(
        f"pool {pool.name!r}: hardware.name {name!r} names no hardware profile of the "
        f"simulator, which would guess its overheads and memory; known profiles: {known} "
        f"(name one as hardware.name or simulator.profile, or write 'simulator.profile: "
        f"{GENERIC}' for generic GPU overheads)"
    )


def device_for(pool: Pool) -> Device:
    model, hardware = facts_of(pool)
    prof = profile_for(pool)
    base = prof.overheads
    overheads = Overheads(base.request_s, base.step_s + pool.simulator.step_overhead_s, base.seq_s)
    kv_dtype = pool.levers.kv_dtype_bytes or prof.kv_dtype_bytes or model.dtype_bytes
    return Device(
        shape=model.to_shape(kv_dtype),
        rates=hardware.to_rates(),
        attention_efficiency=prof.attention_efficiency,
        overheads=overheads,
    )


def kv_cache_bytes(pool: Pool, dialect: Dialect) -> float:
    """KV-cache bytes of one engine of ``pool`` [B]."""
    model, hardware = facts_of(pool)
    if hardware.kv_cache_bytes is not None:
        return hardware.kv_cache_bytes
    prof = profile_for(pool)
    if prof.facts.kv_cache_bytes is not None:
        return prof.facts.kv_cache_bytes
    return engine_kv_bytes(dialect.engine, prof.memory_bytes, model.to_shape().weight_bytes)


def _acceptance(pool: Pool) -> tuple[float, ...]:
    """The per-position acceptance of a draft-model pool (module docstring)."""
    knobs = pool.simulator
    if knobs.acceptance_by_position is not None:
        return tuple(knobs.acceptance_by_position)
    return (knobs.acceptance_rate,)


DRAFT_MODEL_COST = 0.05
"""c for a draft model when the fleet file does not say: a one-layer head (EAGLE) costs ~5 %
of a target decode step per drafted token."""


def _draft_cost(pool: Pool) -> float:
    """c, drafting time per draft token as a fraction of a decode step (module docstring)."""
    spec, given = pool.levers.speculative, pool.simulator.draft_cost
    if given is not None:
        return given
    return 0.0 if spec is not None and spec.method == "ngram" else DRAFT_MODEL_COST


def _ngram(pool: Pool) -> tuple[int, int] | None:
    """(min_n, max_n) of an n-gram pool: the look-up window ridge renders for its engines."""
    spec = pool.levers.speculative
    if spec is None or spec.method != "ngram":
        return None
    return NGRAM_LOOKUP["prompt_lookup_min"], NGRAM_LOOKUP["prompt_lookup_max"]


def host_blocks(pool: Pool, num_blocks: int, block: int, per_token: float) -> int:
    """Blocks of ``pool``'s host KV tier (0 without one); ValueError where the engine would
    refuse the size (:data:`HOST_LARGER`)."""
    tier = pool.levers.host_kv_cache
    if tier is None:
        return 0
    host = host_tier_blocks(tier.size_bytes, per_token, block)
    if pool.engine in HOST_LARGER and host <= num_blocks:
        raise ValueError(
            f"pool {pool.name!r}: the host KV tier holds {host * block} tokens, not more than "
            f"the device's {num_blocks * block} (SGLang would refuse to start)"
        )
    return host


def engine_config(pool: Pool) -> EngineConfig:
    """Everything one engine of ``pool`` is configured with."""
    max_context = facts_of(pool)[0].max_context
    dialect = DIALECTS[pool.engine]
    device = device_for(pool)
    block = dialect.block_size[profile_for(pool).kind]
    per_token = device.shape.kv_bytes_per_token
    num_blocks = int(kv_cache_bytes(pool, dialect) // (per_token * block))
    if num_blocks * block < max_context:
        raise ValueError(
            f"pool {pool.name!r}: the KV cache holds {num_blocks * block} tokens, fewer than "
            f"max_context {max_context} (the engine would refuse to start)"
        )
    chunk = pool.levers.chunked_prefill
    chunked = chunk is not None and chunk.enabled
    budget = (
        chunk.token_budget
        if chunk is not None and chunked
        else max(max_context, dialect.unchunked_min_budget)
    )
    spec = pool.levers.speculative
    scheduler = EngineSchedulerConfig(
        token_budget=budget,
        max_num_seqs=dialect.max_num_seqs,
        chunked=chunked,
        mixed_batches=dialect.mixed_batches,
        wake_takes_one=dialect.wake_takes_one,
        spec_k=spec.num_draft_tokens if spec is not None else 0,
        kv_bytes_per_token=per_token,
    )
    return EngineConfig(
        device=device,
        num_blocks=num_blocks,
        block_size=block,
        prefix_caching=pool.levers.prefix_caching,
        scheduler=scheduler,
        spec_acceptance=_acceptance(pool),
        ngram=_ngram(pool),
        draft_cost=_draft_cost(pool),
        host_blocks=host_blocks(pool, num_blocks, block, per_token),
        host_link_bandwidth=facts_of(pool)[1].host_link_bandwidth,
    )
