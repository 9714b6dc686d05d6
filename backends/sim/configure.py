"""From a pool of the fleet file to the settings of one simulated engine.

* Facts: a pool needs both ``model`` and ``hardware`` facts (a catalogue name or full facts)
  to be simulated; without them :func:`engine_config` raises
  :class:`~backends.fleet_file.FleetConfigError` naming the pool and what it lacks.
* Device: the pool's ``model`` and ``hardware`` facts, calibrated by a hardware profile
  (``simulator.profile``, else the profile named by ``hardware.name`` or by another name the
  catalogue knows that accelerator by (:func:`backends.catalog.accelerator_names`), else a
  generic GPU, with the catalogue's memory size when the catalogue knows the accelerator): its
  attention efficiency, KV dtype and overheads (the pool's ``simulator.step_overhead_s`` is added
  to the profile's per-step overhead).
* KV cache [B]: ``hardware.kv_cache_bytes``, else the profile's, else the engine's share of device
  memory minus the weights: ``memory_fraction · memory_bytes − N · dtype_bytes`` (vLLM's
  ``gpu_memory_utilization`` 0.9, SGLang's ``mem_fraction_static`` ≈ 0.88).
  Blocks = ⌊KV bytes ÷ (KV bytes per token · block size)⌋; fewer than ``max_context`` tokens is
  an error, as it is for vLLM at start-up.
* Token budget per step: ``levers.chunked_prefill.token_budget`` when chunked prefill is on, else
  ``max(max_context, engine minimum)`` so a whole prompt fits one step.
* Speculative decoding: K = ``levers.speculative.num_draft_tokens``,
  α = ``simulator.acceptance_rate``, c = ``simulator.draft_cost``.
"""

from __future__ import annotations

from dataclasses import replace

from backends.catalog import ACCELERATORS, accelerator_names
from backends.fleet_file import FleetConfigError, HardwareFacts, ModelFacts, Pool
from backends.sim.behaviour import DIALECTS, Dialect
from backends.sim.device import Device, Overheads
from backends.sim.engine import EngineConfig
from backends.sim.profiles import GENERIC_GPU, HARDWARE, HardwareProfile, hardware_profile
from backends.sim.scheduler import SchedulerConfig


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
    """The calibration profile of ``pool`` (see the module docstring)."""
    if pool.simulator.profile is not None:
        return hardware_profile(pool.simulator.profile)
    name = facts_of(pool)[1].name
    catalogued = accelerator_names(name)  # () when the catalogue does not know it
    for known in (name, *catalogued):
        if known in HARDWARE:
            return HARDWARE[known]
    if catalogued:  # no calibration, but the datasheet's memory size
        return replace(GENERIC_GPU, memory_bytes=ACCELERATORS[catalogued[0]].memory_bytes)
    return GENERIC_GPU


def device_for(pool: Pool) -> Device:
    model, hardware = facts_of(pool)
    prof = profile_for(pool)
    base = prof.overheads
    overheads = Overheads(base.request_s, base.step_s + pool.simulator.step_overhead_s, base.seq_s)
    kv_dtype = prof.kv_dtype_bytes if prof.kv_dtype_bytes is not None else model.dtype_bytes
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
    weights = model.to_shape().weight_bytes
    return max(0.0, dialect.memory_fraction * prof.memory_bytes - weights)


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
    scheduler = SchedulerConfig(
        token_budget=budget,
        max_num_seqs=dialect.max_num_seqs,
        chunked=chunked,
        mixed_batches=dialect.mixed_batches,
        spec_k=spec.num_draft_tokens if spec is not None else 0,
        kv_bytes_per_token=per_token,
    )
    return EngineConfig(
        device=device,
        num_blocks=num_blocks,
        block_size=block,
        prefix_caching=pool.levers.prefix_caching,
        scheduler=scheduler,
        spec_alpha=pool.simulator.acceptance_rate,
        draft_cost=pool.simulator.draft_cost,
    )
