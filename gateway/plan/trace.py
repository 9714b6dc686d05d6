"""Reading a Mooncake-format traffic trace, the format ridge records
(:mod:`gateway.telemetry.trace`; docs/benchmarks/trace.md).

A trace line is ``{"timestamp": ms, "input_length": tokens, "output_length": tokens,
"hash_ids": [ints]}``, one hash id per block of ``block_tokens`` prompt tokens. Prompts are
synthesised so that engines see the trace's sharing (:class:`BlockTexts`: a hash id is always
the same text, a prompt its blocks' texts cut to ``input_length`` × 4 characters, the
characters-per-token estimate). :func:`trace_f` is the trace's ideal prefix share. The planner
(:mod:`gateway.plan.evaluate`) and the wall-clock replay (``ridge bench --trace``) build the
same prompts from the same trace and seed.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from routing.tokens.counters import CHARS_PER_TOKEN

CHARS = int(CHARS_PER_TOKEN)
"""[characters] Of synthesised prompt text per token."""
BLOCK_TOKENS = 512
"""[tokens] Mooncake's block size: one hash id per 512 prompt tokens."""

_WORD_TEXT = """
account action address agent amount answer area argument balance basis batch billing branch
budget buffer cache call capacity case change channel check claim client code column comment
config contract cost count credit customer data date deadline default delivery detail device
document draft entry error estimate event field file filter format function goal group handler
history index input invoice issue item job key label layer limit line list load log manager
market memory message method metric model module name network node note number object offer
order output owner package page parameter partner path payment period plan policy pool price
priority process product profile project query queue quote range rate reason record region
release report request resource result review risk role route rule sample schedule schema scope
search section service session setting shipment signal source stage state status step storage
stream summary supplier support system table target task team tenant test ticket time token
topic total track transfer trend type update usage user value vendor version warehouse window
"""
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())
"""Ordinary English words: synthesised prompts read as prose (the benchmarks' too)."""


@dataclass(frozen=True, slots=True)
class TraceEntry:
    """One trace line: arrival [ms], prompt and output lengths [tokens], block hash ids."""

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
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    if not entries:
        raise ValueError(f"{path}: no trace records")
    return sorted(entries, key=lambda e: e.timestamp_ms)


def words(rng: random.Random, chars: int) -> str:
    """Words drawn from ``rng`` until the text has at least ``chars`` characters."""
    out: list[str] = []
    have = 0
    while have < chars:
        drawn = rng.choices(WORDS, k=chars // 8 + 1)
        out += drawn
        have += sum(map(len, drawn)) + len(drawn)
    return " ".join(out)


@dataclass
class BlockTexts:
    """Deterministic text per hash id (module doc); memoised per id."""

    seed: int = 0
    block_tokens: int = BLOCK_TOKENS
    _texts: dict[int, str] = field(default_factory=dict)

    @property
    def block_chars(self) -> int:
        return self.block_tokens * CHARS

    def text(self, hash_id: int) -> str:
        found = self._texts.get(hash_id)
        if found is None:
            rng = random.Random(f"{self.seed}:block:{hash_id}")
            body = f"[{hash_id}] " + words(rng, self.block_chars)
            found = self._texts[hash_id] = body[:self.block_chars - 1] + "\n"
        return found

    def prompt(self, entry: TraceEntry) -> str:
        """``entry``'s prompt: its blocks' texts, ``input_length`` × 4 characters (at least
        one character). Ids missing for the tail (a short ``hash_ids``) get texts of their own,
        keyed by the request's first id and position."""
        chars = max(1, entry.input_length * CHARS)
        parts, have = [], 0
        for hash_id in entry.hash_ids:
            if have >= chars:
                break
            parts.append(self.text(hash_id))
            have += self.block_chars
        while have < chars:
            rng = random.Random(f"{self.seed}:tail:{entry.hash_ids[:1]}:{len(parts)}:{have}")
            parts.append(words(rng, self.block_chars)[:self.block_chars].ljust(self.block_chars))
            have += self.block_chars
        return "".join(parts)[:chars]


def trace_f(entries: Iterable[TraceEntry], block_tokens: int = BLOCK_TOKENS) -> float:
    """The trace's prefix share f by construction: the share of prompt tokens in blocks an
    earlier request already sent, counted up to a request's first new block."""
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
