"""A long multi-turn trace: sessions over large contexts that come back after minutes.

The shape of traffic that binds on KV capacity (``docs/benchmarks/capacity.md``), written in the
Mooncake trace format (:mod:`ridge_bench.replay.trace`), with the parameters of
:class:`SessionShape`: Poisson session starts; each session a shared system prompt, a context
of its own and several turns, each turn's prompt its parent's plus the reply and a new message;
between turns a quick think, or with probability ``away_share`` minutes away, when a small
cache may have evicted it. Hash ids in first-seen order; deterministic for a seed.
See docs/benchmarks/capacity.md#the-long-session-trace.
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
