"""Traffic recording: the requests ridge serves as a privacy-preserving trace, no text.

Format: the Mooncake trace (one JSON line per request: ``timestamp`` [ms since the file's first
request], ``input_length`` and ``output_length`` [tokens], ``hash_ids``: one id per trace block
of ``block_tokens`` tokens, equal ids at position i ⇔ equal prompts up to block i), written in
completion order. The ids come from the router's own chained block hashes (:func:`trace_keys`),
numbered in first-seen order per file (:class:`HashIds`): no rehashing, no prompt text.

Off by default (``RIDGE_TRACE__PATH``). On, a request costs one append to a bounded queue
(:meth:`TraceRecorder.offer`; a full queue drops it, counted in ``ridge_trace_dropped_total``);
:class:`TraceWriter` formats and writes in a thread and rotates the file past ``max_bytes`` or
``max_ids``, keeping ``max_files``. See docs/telemetry.md#traffic-recording and
docs/benchmarks/trace.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from prometheus_client import CollectorRegistry, Counter

from gateway.request.body import GENERATION, ParsedRequest
from gateway.settings import TraceSettings
from routing.features import RequestFeatures

log = logging.getLogger("ridge")

MOONCAKE_BLOCK_TOKENS = 512  # tokens per hash id in Mooncake's published traces

Item = tuple[RequestFeatures, float, int]
"""(features, arrival [s, the proxy's clock], output tokens) of one finished request."""


@dataclass(frozen=True, slots=True)
class TraceConfig:
    """Where and how much: ``path`` of the current file; ``max_bytes`` per file;
    ``max_files`` on disk (current + rotated); ``block_tokens`` per hash id;
    ``router_block_tokens``: tokens per router block hash; ``queue_size``: requests held in
    memory before dropping; ``flush_interval_s``; ``max_ids``: distinct ids per file."""

    path: str
    max_bytes: int = 64 * 1024 * 1024
    max_files: int = 5
    block_tokens: int = MOONCAKE_BLOCK_TOKENS
    router_block_tokens: int = 16
    queue_size: int = 10_000
    flush_interval_s: float = 1.0
    max_ids: int = 1_000_000

    def __post_init__(self) -> None:
        if min(self.max_bytes, self.max_files, self.block_tokens, self.router_block_tokens,
               self.queue_size, self.max_ids) < 1 or self.flush_interval_s <= 0:
            raise ValueError("trace sizes and counts must be >= 1, the interval positive")


def trace_keys(hashes: Sequence[int], prompt_tokens: int, group: int,
               block_tokens: int) -> list[Hashable]:
    """One key per trace block of ``block_tokens`` tokens of a ``prompt_tokens`` prompt whose
    router block hashes are ``hashes``, ``group`` router blocks a trace block (module doc)."""
    blocks = -(-max(0, prompt_tokens) // block_tokens)
    full = min(len(hashes) // group, blocks)
    keys: list[Hashable] = [hashes[(j + 1) * group - 1] for j in range(full)]
    for j in range(full, blocks):
        keys.append((j, hashes[-1]) if hashes else object())
    return keys


class HashIds:
    """Keys → small ints in first-seen order (0, 1, 2 …), as Mooncake's traces number them."""

    __slots__ = ("_ids",)

    def __init__(self) -> None:
        self._ids: dict[Hashable, int] = {}

    def __len__(self) -> int:
        return len(self._ids)

    def ids(self, keys: Sequence[Hashable]) -> list[int]:
        table = self._ids
        return [table.setdefault(k, len(table)) for k in keys]


def trace_line(timestamp_ms: int, input_length: int, output_length: int,
               hash_ids: Sequence[int]) -> bytes:
    """One line of the trace (with its newline)."""
    return (json.dumps({"timestamp": timestamp_ms, "input_length": input_length,
                        "output_length": output_length, "hash_ids": list(hash_ids)},
                       separators=(", ", ": ")) + "\n").encode()


def rotated(path: Path, n: int) -> Path:
    """The ``n``-th rotated file of ``path`` (``trace.jsonl.1`` …; 0: ``path`` itself)."""
    return path if n == 0 else path.with_name(f"{path.name}.{n}")


def rotate(path: Path, max_files: int) -> None:
    """Shift ``path`` → ``.1`` → ``.2`` …, dropping what would be file number ``max_files``."""
    for n in range(max_files - 1, 0, -1):
        if rotated(path, n - 1).exists():
            rotated(path, n - 1).replace(rotated(path, n))
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # max_files == 1: nothing is kept


class TraceWriter:
    """Turns finished requests into trace lines and writes them, rotating (synchronous; the
    recorder runs it in a thread, one batch at a time)."""

    def __init__(self, config: TraceConfig) -> None:
        self._config = config
        self._path = Path(config.path)
        self._group = max(1, round(config.block_tokens / config.router_block_tokens))
        self._ids = HashIds()
        self._file: IO[bytes] | None = None
        self._size = 0
        self._zero: float | None = None

    def write(self, items: Sequence[Item]) -> None:
        """Format ``items`` and append them, rotating when a bound is reached."""
        for features, arrival, output in items:
            keys = trace_keys(features.block_hashes, features.prompt_tokens, self._group,
                              self._config.block_tokens)
            if len(self._ids) + len(keys) > self._config.max_ids:
                self._rotate()
            line = self._line(features, arrival, output, keys)
            if self._size and self._size + len(line) > self._config.max_bytes:
                self._rotate()
                line = self._line(features, arrival, output, keys)
            self._open().write(line)
            self._size += len(line)
        if self._file is not None:
            self._file.flush()

    def _line(self, features: RequestFeatures, arrival: float, output: int,
              keys: Sequence[Hashable]) -> bytes:
        if self._zero is None:
            self._zero = arrival
        return trace_line(max(0, round((arrival - self._zero) * 1000)), features.prompt_tokens,
                          output, self._ids.ids(keys))

    def _open(self) -> IO[bytes]:
        if self._file is None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            if self._path.exists() and self._path.stat().st_size:
                rotate(self._path, self._config.max_files)  # an earlier run's trace
            self._file = self._path.open("ab")
            self._size = 0
        return self._file

    def _rotate(self) -> None:
        """Close the current file and start a new trace (ids and time zero anew)."""
        self.close()
        rotate(self._path, self._config.max_files)
        self._ids, self._zero = HashIds(), None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class TraceRecorder:
    """The bounded queue (:meth:`offer`, on the hot path) and the task that drains it into a
    :class:`TraceWriter` (module doc). ``start`` and ``stop`` inside the running loop."""

    def __init__(self, config: TraceConfig, dropped: Counter) -> None:
        self.config = config
        self._queue: deque[Item] = deque()
        self._writer = TraceWriter(config)
        self._task: asyncio.Task[None] | None = None
        self.dropped = dropped

    def offer(self, parsed: ParsedRequest | None, features: RequestFeatures, arrival: float,
              output_tokens: int | None) -> None:
        """Queue one finished generation request (``arrival``: its start on the proxy's clock
        [s]; other APIs are left out); drop and count it when the queue is full."""
        if parsed is None or parsed.api_path not in GENERATION:
            return
        if len(self._queue) >= self.config.queue_size:
            self.dropped.inc()
            return
        output = output_tokens if output_tokens is not None else \
            features.max_tokens or features.expected_output_tokens
        self._queue.append((features, arrival, output))

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._drain_forever(), name="ridge-trace")

    async def stop(self) -> None:
        """Stop the task, write what is queued, close the file."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.flush()
        await asyncio.to_thread(self._writer.close)

    async def flush(self) -> None:
        """Write what is queued now."""
        batch, self._queue = self._queue, deque()
        if not batch:
            return
        try:
            await asyncio.to_thread(self._writer.write, batch)
        except OSError as exc:
            self.dropped.inc(len(batch))
            log.warning("traffic trace %s not written: %s", self.config.path, exc)

    async def _drain_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.flush_interval_s)
            await self.flush()


def worker_path(path: str, index: int | None) -> str:
    """The trace file of worker ``index`` of ``ridge serve --workers N`` (``trace.jsonl`` →
    ``trace.w1.jsonl``), ``path`` itself for a single process (None)."""
    if index is None:
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}.w{index}{p.suffix}"))


def build_recorder(settings: TraceSettings, router_block_tokens: int,
                   registry: CollectorRegistry, worker: int | None = None
                   ) -> TraceRecorder | None:
    """The recorder the settings ask for (None: recording is off). ``router_block_tokens``:
    the fleet's ``routing.features.block_tokens``; ``worker``: this process's worker index.
    ``ridge_trace_dropped_total`` is on ``registry`` either way (0 while off)."""
    dropped = dropped_counter(registry)
    if settings.path is None:
        return None
    config = TraceConfig(worker_path(settings.path, worker), settings.max_bytes,
                         settings.max_files, settings.block_tokens, router_block_tokens,
                         settings.queue_size, settings.flush_interval_s, settings.max_ids)
    return TraceRecorder(config, dropped)


def dropped_counter(registry: CollectorRegistry) -> Counter:
    """``ridge_trace_dropped_total``: requests left out of the trace."""
    return Counter("ridge_trace_dropped_total", "Requests left out of the traffic trace (its "
                   "in-memory queue was full, or the file could not be written)",
                   registry=registry)
