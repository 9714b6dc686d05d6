"""Step time of one engine forward pass from the roofline model. Pure functions, no state.

An engine step runs one forward pass over a batch of sequences. Sequence ``i`` brings ``q_i`` new
tokens (a prefill chunk, one decode token, or 1 + K tokens for a speculative verify pass) on top of
``c_i`` tokens already held in its KV cache. The step costs:

* linear FLOPs  = 2 · N · Σ q_i                                   [FLOP]
  (every weight is one multiply-add per token: N params → 2·N FLOP per token)
* attention FLOPs = 4 · L · d · Σ (q_i · c_i + q_i · (q_i + 1) / 2)  [FLOP]
  (per layer, a query/key pair costs 2·d for Q·Kᵀ and 2·d for P·V, d = hidden size = heads · head
  dim; new token j of a sequence attends to the c_i cached tokens and to itself and the j - 1 new
  tokens before it, causally: Σ_j (c_i + j) = q_i · c_i + q_i (q_i + 1) / 2 pairs. Per token at
  context c this is the 4·L·d·c term, which rivals the 2·N term once c ≳ N / (2·L·d) ≈ 12·d tokens
  for Llama-shaped models)
* bytes read  = N · w  +  kv · Σ (c_i + q_i)                        [B]
  (the weights once per step for the whole batch, then each sequence's keys and values)
* bytes written = kv · Σ q_i                                      [B]
  (the new tokens' keys and values)

with w = bytes per weight and kv = KV bytes per token = 2 · L · kv_heads · head_dim · kv_dtype_bytes
(2 = one key and one value vector per layer and KV head). Activations are ignored.

    compute time = linear FLOPs / peak + attention FLOPs / (peak · attention_efficiency)   [s]
    memory time  = (bytes read + bytes written) / memory bandwidth                      [s]
    step time    = max(compute time, memory time) + step overhead + seq overhead · batch [s]

Parameters: ``peak`` dense FLOP/s and ``memory bandwidth`` B/s come from the pool's hardware facts;
``attention_efficiency`` (≤ 1, default 1) is the fraction of peak the attention kernels reach
(calibrated below 1 for CPUs); ``step overhead`` (s per step: scheduling, kernel launches) and
``seq overhead`` (s per sequence in the batch: sampling, detokenising) come from the profile.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from backends.config import HardwareFacts, ModelFacts


@dataclass(frozen=True, slots=True)
class SeqWork:
    """One sequence's share of a step: ``new_tokens`` (q) computed over ``context`` (c) cached."""

    new_tokens: int
    context: int


@dataclass(frozen=True, slots=True)
class Overheads:
    """Fixed costs on top of the roofline. Units: seconds per request, per step, per sequence."""

    request_s: float = 0.0
    step_s: float = 0.0
    seq_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Device:
    """What the roofline needs to know about one engine: model shape, peak rates, calibration."""

    model: ModelFacts
    hardware: HardwareFacts
    kv_dtype_bytes: float
    attention_efficiency: float = 1.0
    overheads: Overheads = Overheads()


@dataclass(frozen=True, slots=True)
class StepCost:
    """A step's work and time. Units: FLOP, bytes, seconds."""

    linear_flops: float
    attention_flops: float
    read_bytes: float
    write_bytes: float
    compute_s: float
    memory_s: float
    seconds: float

    @property
    def flops(self) -> float:
        return self.linear_flops + self.attention_flops

    @property
    def bound(self) -> str:
        """Which roof binds this step: "compute" or "memory"."""
        return "compute" if self.compute_s >= self.memory_s else "memory"


def kv_bytes_per_token(model: ModelFacts, kv_dtype_bytes: float | None = None) -> float:
    """KV bytes per token [B] = 2 · layers · kv_heads · head_dim · dtype_bytes."""
    dtype = model.dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
    return 2.0 * model.layers * model.kv_heads * model.head_dim * dtype


def weight_bytes(model: ModelFacts) -> float:
    """Bytes of weights read per forward pass [B] = N · dtype_bytes."""
    return model.params * model.dtype_bytes


def linear_flops(model: ModelFacts, tokens: int) -> float:
    """Dense-layer FLOPs [FLOP] = 2 · N · tokens."""
    return 2.0 * model.params * tokens


def attention_flops(model: ModelFacts, new_tokens: int, context: int) -> float:
    """Attention FLOPs [FLOP] for ``new_tokens`` (q) over ``context`` (c) cached tokens:
    4 · layers · hidden · (q·c + q·(q+1)/2)."""
    pairs = new_tokens * context + new_tokens * (new_tokens + 1) / 2.0
    return 4.0 * model.layers * model.hidden_size * pairs


def step_cost(device: Device, work: Sequence[SeqWork]) -> StepCost:
    """The roofline cost of one step over ``work`` (see the module docstring for every term)."""
    if not work:
        return StepCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    model = device.model
    kv = kv_bytes_per_token(model, device.kv_dtype_bytes)
    tokens = sum(w.new_tokens for w in work)
    lin = linear_flops(model, tokens)
    att = sum(attention_flops(model, w.new_tokens, w.context) for w in work)
    read = weight_bytes(model) + kv * sum(w.context + w.new_tokens for w in work)
    write = kv * tokens
    peak = device.hardware.peak_flops
    compute_s = lin / peak + att / (peak * device.attention_efficiency)
    memory_s = (read + write) / device.hardware.mem_bandwidth
    over = device.overheads.step_s + device.overheads.seq_s * len(work)
    return StepCost(lin, att, read, write, compute_s, memory_s, max(compute_s, memory_s) + over)


def decode_step_seconds(device: Device, batch: int, context: int) -> float:
    """Time [s] of one decode step for ``batch`` sequences each holding ``context`` tokens."""
    return step_cost(device, [SeqWork(1, context)] * batch).seconds


def prefill_seconds(device: Device, prompt_tokens: int, cached_tokens: int = 0) -> float:
    """Time [s] of one step that prefills ``prompt_tokens - cached_tokens`` uncached tokens."""
    work = SeqWork(prompt_tokens - cached_tokens, cached_tokens)
    return step_cost(device, [work]).seconds


def ridge_point(hardware: HardwareFacts) -> float:
    """The ridge: FLOP per byte [FLOP/B] above which a step is compute-bound = peak / bandwidth."""
    return hardware.peak_flops / hardware.mem_bandwidth
