"""Replay of a Mooncake-format traffic trace (``ridge bench --trace FILE``), the format ridge
records (:mod:`gateway.telemetry.trace`; ``docs/benchmarks/trace.md``).

A trace line is ``{"timestamp": ms, "input_length": tokens, "output_length": tokens,
"hash_ids": [ints]}``, one hash id per block of ``block_tokens`` prompt tokens. Prompts are
synthesised so the engines see the trace's sharing (:class:`BlockTexts`: a hash id is always
the same text, a prompt its blocks' texts cut to ``input_length``), sent as a streamed chat
completion of ``output_length`` tokens with ``ignore_eos``. Arrivals are the lines sorted by
timestamp, rebased and divided by ``speedup``, sent open loop
(:func:`ridge_bench.harness.driver.run_workload`); :func:`trace_f` is the trace's ideal prefix
share. See docs/benchmarks/trace.md#replay-as-implemented.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ridge_bench.harness import corpus
from ridge_bench.harness.workloads import Arrival, Conversation, LoadStep, Turn, Workload

TRACE = "trace"
BLOCK_TOKENS = 512  # Mooncake's block size
TRACES_DIR = Path(__file__).parent.parent / "traces"


@dataclass(frozen=True, slots=True)
class TraceEntry:
    """One trace line."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def parse_line(line: str) -> TraceEntry:
    """One line; ValueError when it is not a Mooncake trace record."""
    record: Any = json.loads(line)
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    ts, inp, out, ids = (record.get(k) for k in
                         ("timestamp", "input_length", "output_length", "hash_ids"))
    if not isinstance(ts, int | float) or ts < 0 or not _count(inp) or not _count(out):
        raise ValueError("timestamp, input_length and output_length must be numbers >= 0")
    if not isinstance(ids, list) or not all(_count(i) for i in ids):
        raise ValueError("hash_ids must be a list of non-negative integers")
    assert isinstance(inp, int) and isinstance(out, int)
    return TraceEntry(float(ts), inp, out, tuple(ids))


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _parsed(line: str, path: str | Path, number: int) -> TraceEntry:
    try:
        return parse_line(line)
    except ValueError as exc:
        raise ValueError(f"{path}:{number}: {exc}") from None


def load_trace(path: str | Path) -> list[TraceEntry]:
    """Every record of the file, sorted by timestamp (stable); ValueError naming the line."""
    entries = []
    try:
        with Path(path).open(encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if line.strip():
                    entries.append(_parsed(line, path, number))
    except OSError as exc:
        raise ValueError(f"cannot read the trace: {exc}") from None
    if not entries:
        raise ValueError(f"{path}: no trace records")
    return sorted(entries, key=lambda e: e.timestamp_ms)


@dataclass
class BlockTexts:
    """Deterministic text per hash id (module doc); memoised per id."""

    seed: int = 0
    block_tokens: int = BLOCK_TOKENS
    _texts: dict[int, str] = field(default_factory=dict)

    @property
    def block_chars(self) -> int:
        return self.block_tokens * corpus.CHARS_PER_TOKEN

    def text(self, hash_id: int) -> str:
        found = self._texts.get(hash_id)
        if found is None:
            rng = random.Random(f"{self.seed}:block:{hash_id}")
            body = f"[{hash_id}] " + corpus.text(rng, self.block_tokens)
            while len(body) < self.block_chars:
                body += " " + corpus.text(rng, self.block_tokens // 4 + 1)
            found = self._texts[hash_id] = body[:self.block_chars - 1] + "\n"
        return found

    def prompt(self, entry: TraceEntry) -> str:
        """``entry``'s prompt: its blocks' texts, ``input_length`` × 4 characters (at least
        one character). Ids missing for the tail (a short ``hash_ids``) get texts of their own,
        keyed by the request's first id and position."""
        chars = max(1, entry.input_length * corpus.CHARS_PER_TOKEN)
        parts, have = [], 0
        for hash_id in entry.hash_ids:
            if have >= chars:
                break
            parts.append(self.text(hash_id))
            have += self.block_chars
        while have < chars:
            rng = random.Random(f"{self.seed}:tail:{entry.hash_ids[:1]}:{len(parts)}:{have}")
            parts.append(corpus.text(rng, self.block_tokens).ljust(self.block_chars))
            have += self.block_chars
        return "".join(parts)[:chars]


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


def trace_f(entries: Iterable[TraceEntry], block_tokens: int = BLOCK_TOKENS) -> float:
    """The trace's prefix share f by construction (module doc)."""
    seen: set[int] = set()
    matched = total = 0
    for e in entries:
        hits = 0
        for hash_id in e.hash_ids:
            if hash_id not in seen:
                break
            hits += 1
        matched += min(e.input_length, hits * block_tokens)
        total += e.input_length
        seen.update(e.hash_ids)
    return matched / total if total else 0.0


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
