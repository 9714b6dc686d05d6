"""The roofline's ridge point, and where decoding crosses it.

A kernel is compute-bound when its arithmetic intensity (FLOPs per byte moved) exceeds the
hardware's ridge point, and bandwidth-bound below it:

    ridge point [FLOP/byte] = peak FLOP/s ÷ memory bandwidth [bytes/s]

One decode step for a batch of B tokens does ≈ 2·N·B FLOPs (N parameters) and reads the
weights once, N·dtype_bytes bytes, so its intensity is 2·B / dtype_bytes FLOP/byte. Decoding
stays bandwidth-bound (batching is nearly free, and speculative decoding's extra verify tokens
cost little) until

    B_ridge [tokens] = ridge point × dtype_bytes / 2

Worked number: an H100 SXM (989e12 FLOP/s dense bf16, 3.35e12 bytes/s) has a ridge point of
≈295 FLOP/byte; with 2-byte weights B_ridge ≈ 295 tokens in flight per step. Past it, the
verify tokens of speculation compete with real work and its gain collapses. (KV-cache reads,
ignored here, push the crossover further out for long contexts.)
"""

from __future__ import annotations


def ridge_point(peak_flops: float, mem_bandwidth: float) -> float:
    """FLOP/byte at which compute time equals memory time (FLOP/s ÷ bytes/s)."""
    return peak_flops / mem_bandwidth


def decode_ridge_tokens(peak_flops: float, mem_bandwidth: float, dtype_bytes: float) -> float:
    """Tokens per decode step at which decoding turns compute-bound (tokens)."""
    return ridge_point(peak_flops, mem_bandwidth) * dtype_bytes / 2.0
