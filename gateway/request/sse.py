"""Server-sent events relayed as they arrive: the engine's bytes pass through undecoded, and a
cheap byte inspection finds what ridge needs.

:class:`StreamScanner` takes the upstream body chunk by chunk and returns the bytes to send on,
holding back only an incomplete trailing event (relayed bytes end at an event boundary). Per
complete region, by byte search, never by parsing JSON: the token events (for TTFT and the
inter-token gaps) and the usage event, the one event parsed as JSON (``body.loads``), cut from
the relay when ridge asked for it on its own account (``strip_usage``); and, at the stream's end,
whether its last event came (``ended``, looked for in the last region and what is held back: a
stream without it broke off). The keys are found by :mod:`gateway.request.event_keys`: a call
or two a region, as each builtin call costs more than the search it makes.

An incomplete event held back past ``max_event_bytes`` raises
:class:`~backends.upstream.client.UpstreamStreamError`. See docs/gateway.md#streams.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any, Final

from backends.upstream.client import UpstreamStreamError
from gateway.request.answers import chat_stream_ended
from gateway.request.body import loads
from gateway.request.event_keys import chat_tokens, holds_usage, text_tokens

_USAGE: Final = re.compile(rb'"usage"\s*:\s*\{')
_NO_CHOICES: Final = re.compile(rb'"choices"\s*:\s*\[\s*\]')
MAX_EVENT_BYTES: Final = 4 * 1024 * 1024  # default cap of one event held back [bytes]


def token_events(region: bytes, completions: bool = False) -> int:
    """How many token events ``region`` (whole events) holds: in a chat stream, non-empty
    ``"content"``, ``"reasoning_content"`` or ``"tool_calls"`` values; in a completions stream
    (``completions``), ``"text"`` ones (:mod:`gateway.request.event_keys`)."""
    return text_tokens(region) if completions else chat_tokens(region)


def _boundary(buffer: bytes, end: int | None = None) -> int:
    """Index just past the last event terminator in ``buffer[:end]``, or 0."""
    n = len(buffer)
    if end is None and n >= 2 and buffer[n - 1] == 0x0A and (  # "\n"
            buffer[n - 2] == 0x0A or (n >= 4 and buffer[n - 2] == 0x0D and
                                      buffer[n - 3] == 0x0A and buffer[n - 4] == 0x0D)):
        return n  # the common case: a piece of whole events, no search (and no call)
    lf = buffer.rfind(b"\n\n", 0, end)
    crlf = buffer.rfind(b"\r\n\r\n", 0, end)
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


def _events_with(region: bytes, marker: re.Pattern[bytes]) -> list[tuple[int, int]]:
    """(start, end) of each event of ``region`` that ``marker`` matches in."""
    spans = []
    found = marker.search(region)
    while found is not None:
        at = found.start()
        start = _boundary(region, at)
        lf, crlf = region.find(b"\n\n", at), region.find(b"\r\n\r\n", at)
        end = min([e + n for e, n in ((lf, 2), (crlf, 4)) if e >= 0], default=len(region))
        spans.append((start, end))
        found = marker.search(region, end)
    return spans


class StreamScanner:
    """Relays an SSE body and watches it (module docstring). ``clock``: seconds;
    ``completions``: a completions stream (else a chat stream: :func:`token_events`)."""

    __slots__ = ("_strip_usage", "_clock", "_max_event", "_completions", "_held", "_last",
                 "first_token_at", "_last_token_at", "gaps", "token_events", "usage", "ended")

    def __init__(self, strip_usage: bool, clock: Callable[[], float] = time.perf_counter,
                 max_event_bytes: int = MAX_EVENT_BYTES, completions: bool = False) -> None:
        self._strip_usage = strip_usage
        self._completions = completions
        self._clock = clock
        self._max_event = max_event_bytes
        self._held = b""
        self._last = b""
        self.first_token_at: float | None = None
        self._last_token_at: float | None = None
        self.gaps: list[float] = []
        self.token_events = 0
        self.usage: dict[str, Any] | None = None
        self.ended = False
        """Whether the stream's last event came (:mod:`gateway.request.answers`), known once
        :meth:`rest` was taken."""

    def feed(self, chunk: bytes) -> bytes:
        """The bytes of ``chunk`` (after what was held back) to relay now."""
        buffer = self._whole_events(chunk)
        if not buffer:
            return b""
        self._last = buffer
        if n := token_events(buffer, self._completions):
            self._tokens(n)
        if holds_usage(buffer) and _USAGE.search(buffer):
            buffer = self._usage(buffer)
        return buffer

    def _ends(self, region: bytes) -> bool:
        """Whether ``region`` (whole events, or the unterminated rest) holds the stream's last
        event."""
        return chat_stream_ended(region)

    def _whole_events(self, chunk: bytes) -> bytes:
        """What was held back and ``chunk``, up to the end of its last whole event; the rest
        is held back (an event past ``max_event_bytes`` raises UpstreamStreamError)."""
        buffer = self._held + chunk if self._held else chunk
        cut = _boundary(buffer)
        if cut < len(buffer):
            self._held, buffer = buffer[cut:], buffer[:cut]
            if len(self._held) > self._max_event:
                raise UpstreamStreamError(f"an event exceeds {self._max_event} bytes")
        else:
            self._held = b""
        return buffer

    def rest(self) -> bytes:
        """What is still held back at the end of the stream (an unterminated last event); sets
        :attr:`ended` from it and the last region relayed."""
        rest, self._held = self._held, b""
        self.ended = self._ends(self._last) or self._ends(rest)
        return rest

    def _tokens(self, n: int) -> None:
        """``n`` token events arrived now: the first one's gap is the time since the last
        token (none for the very first), the others arrived with it (gap 0)."""
        now = self._clock()
        if self._last_token_at is None:
            self.first_token_at = now
        else:
            self.gaps.append(now - self._last_token_at)
        if n > 1:
            self.gaps.extend([0.0] * (n - 1))
        self.token_events += n
        self._last_token_at = now

    def _usage(self, region: bytes) -> bytes:
        """Take the usage figures from the usage-only event(s); cut them out when stripping."""
        kept, last = [], 0
        for start, end in _events_with(region, _USAGE):
            event = region[start:end]
            if not _NO_CHOICES.search(event):
                continue
            usage = _usage_of(event)
            if usage is not None:
                self.usage = usage
            if self._strip_usage:
                kept.append(region[last:start])
                last = end
        if not kept:
            return region
        kept.append(region[last:])
        return b"".join(kept)

    @property
    def completion_tokens(self) -> int | None:
        """Tokens generated: the usage figure when the engine sent one, else token events."""
        if self.usage and isinstance(self.usage.get("completion_tokens"), int):
            return int(self.usage["completion_tokens"])
        return self.token_events or None


def _usage_of(event: bytes) -> dict[str, Any] | None:
    for line in event.splitlines():
        if line.startswith(b"data:"):
            try:
                chunk = loads(line[5:].lstrip(b" "))
            except ValueError:
                return None
            usage = chunk.get("usage") if isinstance(chunk, dict) else None
            return usage if isinstance(usage, dict) else None
    return None


def error_event(message: str, kind: str, code: str) -> bytes:
    """An SSE event carrying an OpenAI-shaped error; OpenAI clients raise it as an APIError."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"
