"""Replay of a Mooncake-format traffic trace (``ridge bench --trace FILE``), the format ridge
records (:mod:`gateway.telemetry.trace`; ``docs/benchmarks/trace.md``).

The records and their prompts are :mod:`gateway.plan.trace`'s (the planner reads the same
trace the same way); each prompt is sent as a streamed chat
completion of ``output_length`` tokens with ``ignore_eos``. Arrivals are the lines sorted by
timestamp, rebased and divided by ``speedup``, sent open loop
(:func:`ridge_bench.harness.driver.run_workload`); :func:`trace_f` is the trace's ideal prefix
share. See docs/benchmarks/trace.md#replay-as-implemented.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.plan.trace import BLOCK_TOKENS, BlockTexts, TraceEntry, load_trace, trace_f
from ridge_bench.harness.workloads import Arrival, Conversation, LoadStep, Turn, Workload

__all__ = ["BLOCK_TOKENS", "TRACE", "TRACES_DIR", "BlockTexts", "TraceEntry", "TraceSource",
           "TraceWorkload", "conversation_trace", "load_trace", "trace_f", "trace_workload",
           "workload_f"]
TRACE = "trace"
TRACES_DIR = Path(__file__).parent.parent / "traces"


@dataclass(frozen=True)
class TraceSource:
    """The trace's requests as single-turn conversations (conversation i = entry i)."""

    entries: tuple[TraceEntry, ...]
    texts: BlockTexts
    kind: str = TRACE

    def conversation(self, index: int) -> Conversation:
        entry = self.entries[index]
        return Conversation(f"{TRACE}-{index:06d}", TRACE, (),
                            (Turn(self.texts.prompt(entry), max(1, entry.output_length)),))


@dataclass(frozen=True)
class TraceWorkload(Workload):
    """A :class:`~ridge_bench.harness.workloads.Workload` whose arrivals are the trace's own
    times."""

    times_s: tuple[float, ...] = ()

    def arrivals(self, limit: int) -> list[Arrival]:
        return [Arrival(t, 0, TRACE) for t in self.times_s[:limit]]


def trace_workload(path: str | Path, seed: int = 0, speedup: float = 1.0,
                   block_tokens: int = BLOCK_TOKENS) -> TraceWorkload:
    """The replay of the trace at ``path``, ``speedup`` times faster than recorded."""
    if speedup <= 0 or block_tokens < 1:
        raise ValueError("--speedup and --block-tokens must be positive")
    entries = tuple(load_trace(path))
    zero = entries[0].timestamp_ms
    times = tuple((e.timestamp_ms - zero) / 1000.0 / speedup for e in entries)
    span = max(times[-1], 1e-3) * (1 + 1e-9) + 1e-6  # the last arrival inside the window
    source = TraceSource(entries, BlockTexts(seed, block_tokens))
    return TraceWorkload(f"{TRACE} {Path(path).name}", seed, {TRACE: source}, {TRACE: 1.0},
                         (LoadStep(len(entries) / span, span),), times_s=times)


def workload_f(workload: Workload, limit: int) -> float:
    """:func:`trace_f` over the first ``limit`` requests of a :func:`trace_workload`."""
    source = workload.sources[TRACE]
    assert isinstance(source, TraceSource)
    return trace_f(source.entries[:limit], source.texts.block_tokens)


def conversation_trace(seed: int = 0, conversations: int = 40, rate: float = 2.0,
                       block_tokens: int = BLOCK_TOKENS) -> list[dict[str, Any]]:
    """A synthetic multi-turn trace (the shipped ``traces/conversations.jsonl``): users share
    one of 3 system prompts (2 blocks), then 3–7 turns; each turn's prompt is the previous
    one, its reply and a new message, so follow-ups extend earlier prompts. Conversations
    start as a Poisson process at ``rate``/s; a user answers 2–8 s after a reply."""
    rng = random.Random(f"{seed}:conversation-trace")
    records: list[dict[str, Any]] = []
    next_id, start = 6, 0.0
    for _ in range(conversations):
        start += rng.expovariate(rate)
        system = rng.randrange(3)
        ids, length, t = [2 * system, 2 * system + 1], 2 * block_tokens, start
        for _turn in range(rng.randint(3, 7)):
            length += rng.randint(60, 900)
            while len(ids) < -(-length // block_tokens):
                ids.append(next_id)
                next_id += 1
            output = rng.randint(40, 400)
            records.append({"timestamp": round(t * 1000), "input_length": length,
                            "output_length": output, "hash_ids": _ids_of(ids, length,
                                                                          block_tokens)})
            length += output
            t += rng.uniform(2.0, 8.0) + output * 0.02
    return sorted(records, key=lambda r: r["timestamp"])


def _ids_of(ids: Sequence[int], length: int, block_tokens: int) -> list[int]:
    return list(ids[:-(-length // block_tokens)])
