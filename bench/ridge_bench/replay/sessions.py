"""A long multi-turn trace: sessions over large contexts that come back after minutes.

The shape of production conversation and agent traffic that binds on KV capacity (the
capacity benchmark, ``docs/benchmarks/capacity.md``), written in the Mooncake trace format
(:mod:`ridge_bench.replay.trace`). Algorithm, with the parameters of :class:`SessionShape`:

- sessions start as a Poisson process at ``session_rate`` per second for ``span_s`` seconds;
- each session opens with one of ``system_prompts`` shared system prompts
  (``system_blocks`` blocks, numbered 0 … ``system_prompts·system_blocks − 1``) and a context
  of its own (a document, a code base) of ``context_tokens`` tokens, uniform;
- it has ``turns`` turns, uniform; each turn's prompt is the previous prompt, the previous
  reply (``output_tokens``, uniform) and a new message (``message_tokens``, uniform), so a
  follow-up repeats its parent's blocks and adds its own;
- between a reply and the next turn the user thinks ``quick_think_s`` (uniform) or, with
  probability ``away_share``, returns after ``away_s`` (uniform): minutes later, when a small
  cache may have evicted the session.

Hash ids are numbered in first-seen order of generation; equal ids mean equal prefixes up to
that block. Deterministic for a seed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ridge_bench.replay.trace import BLOCK_TOKENS

Range = tuple[float, float]


@dataclass(frozen=True, slots=True)
class SessionShape:
    """The generator's parameters (module docstring); tokens, seconds, per-second rates."""

    session_rate: float = 1.5
    span_s: float = 360.0
    system_prompts: int = 4
    system_blocks: int = 4
    context_tokens: Range = (4_000, 16_000)
    turns: Range = (2, 8)
    message_tokens: Range = (50, 600)
    output_tokens: Range = (100, 500)
    quick_think_s: Range = (5.0, 40.0)
    away_share: float = 0.35
    away_s: Range = (60.0, 240.0)


LONG_SESSIONS = SessionShape()
"""The shipped ``traces/long-sessions.jsonl`` (seed 0): 2,570 requests, 13.5k prompt tokens on
average, arriving at 2.2/s over 19.5 minutes; 6.55M distinct prompt tokens."""


@dataclass
class _Ids:
    """Hash ids handed out in order."""

    next_id: int

    def extend(self, ids: list[int], tokens: int, block_tokens: int) -> None:
        while len(ids) < -(-tokens // block_tokens):
            ids.append(self.next_id)
            self.next_id += 1


def session_trace(seed: int = 0, shape: SessionShape = LONG_SESSIONS,
                  block_tokens: int = BLOCK_TOKENS) -> list[dict[str, Any]]:
    """The trace's records (module docstring), sorted by timestamp."""
    rng = random.Random(f"{seed}:session-trace")
    ids = _Ids(shape.system_prompts * shape.system_blocks)
    records: list[dict[str, Any]] = []
    start = rng.expovariate(shape.session_rate)
    while start < shape.span_s:
        records.extend(_session(rng, shape, ids, start, block_tokens))
        start += rng.expovariate(shape.session_rate)
    return sorted(records, key=lambda r: r["timestamp"])


def _session(rng: random.Random, shape: SessionShape, ids: _Ids, start: float,
             block_tokens: int) -> list[dict[str, Any]]:
    system = rng.randrange(shape.system_prompts)
    own = [system * shape.system_blocks + b for b in range(shape.system_blocks)]
    length = shape.system_blocks * block_tokens + _uniform_int(rng, shape.context_tokens)
    out, t = [], start
    for turn in range(_uniform_int(rng, shape.turns)):
        if turn:
            length += _uniform_int(rng, shape.message_tokens)
        ids.extend(own, length, block_tokens)
        output = _uniform_int(rng, shape.output_tokens)
        out.append({"timestamp": round(t * 1000), "input_length": length,
                    "output_length": output, "hash_ids": own[:-(-length // block_tokens)]})
        length += output
        think = shape.away_s if rng.random() < shape.away_share else shape.quick_think_s
        t += rng.uniform(*think)
    return out


def _uniform_int(rng: random.Random, bounds: Sequence[float]) -> int:
    return rng.randint(int(bounds[0]), int(bounds[1]))
