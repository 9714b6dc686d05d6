"""KV-cache events as the router sees them: what an engine stored, removed or cleared.

An engine that publishes KV-cache events (vLLM's or SGLang's ``--kv-events-config``; the
simulator does the same) tells the router exactly which prompt blocks it holds. These are the
decoded events, framework-free; the wire formats live in :mod:`backends.kv_events.wire` and the
subscriber in the gateway. The engine's block hashes are opaque keys (``bytes`` or ``int``,
whichever the engine publishes): the router never recomputes them, it re-hashes the token ids
the events carry into its own chained block hashes (:mod:`routing.kv_events.index`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

MEDIUM_DEVICE = "GPU"
"""The medium vLLM and SGLang name for the accelerator's KV cache (also used for a CPU engine's
own KV cache, ``None`` in older versions); any other medium is a host tier."""


@dataclass(frozen=True, slots=True)
class BlocksStored:
    """Full blocks the engine now holds: ``block_hashes`` (the engine's, one per block or
    page), chained after ``parent`` (the engine's hash of the block before the first, None at
    the prompt's start), ``token_ids`` (all their tokens, ``block_size`` per block), ``medium``
    (``"GPU"``, ``"CPU"`` for a host tier, None = the device). ``plain`` is False when the
    block's hash also covers something the tokens do not show (a LoRA adapter, images, a cache
    salt): the router cannot match such blocks by tokens and skips them."""

    block_hashes: Sequence[Hashable]
    parent: Hashable | None
    token_ids: Sequence[int]
    block_size: int
    medium: str | None = None
    plain: bool = True


@dataclass(frozen=True, slots=True)
class BlocksRemoved:
    """Blocks the engine evicted from ``medium``: the engine's hashes."""

    block_hashes: Sequence[Hashable]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllCleared:
    """The engine dropped its whole prefix cache (a reset)."""


KvEvent = BlocksStored | BlocksRemoved | AllCleared
