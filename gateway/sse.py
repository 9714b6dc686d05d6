"""Server-sent events as they pass through: split the upstream bytes into whole events and
watch them for the first token and the usage figures, without changing a byte.

Splitting at event boundaries adds no delay: engines flush one whole event at a time, so each
event is relayed as soon as its last byte arrives.
"""

from __future__ import annotations

import json
import time
from typing import Any

_BOUNDARIES = (b"\n\n", b"\r\n\r\n")


class EventSplitter:
    """Accumulates bytes; returns the complete events (each with its blank-line terminator)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        events: list[bytes] = []
        while True:
            cut = _first_boundary(self._buffer)
            if cut < 0:
                return events
            events.append(self._buffer[:cut])
            self._buffer = self._buffer[cut:]

    def rest(self) -> bytes:
        """Bytes after the last complete event (normally empty at the end of a stream)."""
        rest, self._buffer = self._buffer, b""
        return rest


def _first_boundary(buffer: bytes) -> int:
    """Index just past the first event terminator, or -1."""
    ends = [i + len(b) for b in _BOUNDARIES if (i := buffer.find(b)) >= 0]
    return min(ends) if ends else -1


class StreamObserver:
    """Watches relayed events: time of the first generated token, the gaps between later
    ones (inter-token latency, seconds), usage, end marker."""

    def __init__(self, clock: Any = time.perf_counter) -> None:
        self._clock = clock
        self.first_token_at: float | None = None
        self._last_token_at: float | None = None
        self.gaps: list[float] = []
        self.content_events = 0
        self.usage: dict[str, Any] | None = None
        self.done = False

    def observe(self, event: bytes) -> bool:
        """Take note of ``event``; True when it is a usage-only chunk (no choices)."""
        usage_only = False
        for data in _data_lines(event):
            if data == b"[DONE]":
                self.done = True
                continue
            try:
                chunk = json.loads(data)
            except ValueError:
                continue
            if isinstance(chunk, dict):
                usage_only = self._chunk(chunk) or usage_only
        return usage_only

    def _chunk(self, chunk: dict[str, Any]) -> bool:
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        choices = chunk.get("choices") or ()
        if any(_has_token(c) for c in choices):
            self._token()
        return isinstance(usage, dict) and not choices

    def _token(self) -> None:
        now = self._clock()
        self.content_events += 1
        if self.first_token_at is None:
            self.first_token_at = now
        elif self._last_token_at is not None:
            self.gaps.append(now - self._last_token_at)
        self._last_token_at = now

    @property
    def completion_tokens(self) -> int | None:
        """Tokens generated: the usage figure when the engine sent one, else content events."""
        if self.usage and isinstance(self.usage.get("completion_tokens"), int):
            return int(self.usage["completion_tokens"])
        return self.content_events or None


def _data_lines(event: bytes) -> list[bytes]:
    return [line[5:].strip() for line in event.splitlines() if line.startswith(b"data:")]


def _has_token(choice: Any) -> bool:
    if not isinstance(choice, dict):
        return False
    if choice.get("text"):
        return True
    delta = choice.get("delta")
    return isinstance(delta, dict) and any(
        delta.get(k) for k in ("content", "reasoning_content", "tool_calls", "reasoning")
    )


def error_event(message: str, kind: str, code: str) -> bytes:
    """An SSE event carrying an OpenAI-shaped error; OpenAI clients raise it as an APIError."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"
