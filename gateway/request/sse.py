"""Server-sent events relayed as they arrive: the engine's bytes pass through undecoded, and a
cheap byte inspection finds what ridge needs.

:class:`StreamScanner` takes the upstream body chunk by chunk and returns the bytes to send on,
holding back only an incomplete trailing event (relayed bytes end at an event boundary). Per
complete region, by byte search, never by parsing JSON: the token events (for TTFT and the
inter-token gaps) and the usage event, the one event parsed as JSON (``body.loads``), cut from
the relay when ridge asked for it on its own account (``strip_usage``); and, at the stream's end,
whether its last event came (``ended``, looked for in the last region and what is held back: a
stream without it broke off). Each byte search is one builtin call, which costs more than the
search it makes, so a region gets one call per key (``bytes.split``, ``bytes.partition``: the
cheapest calls to make) and never bytes' ``in`` (it first tries its operand as an integer).

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

_CONTENT: Final = b'content"'
"""The end of a chat stream's text keys, ``"content"`` and ``"reasoning_content"``: one search
finds both."""
_REASONING: Final = b'"reasoning_'
_TOOL_CALLS: Final = b'"tool_calls"'
"""A chat stream's key whose non-empty array value is a token event."""
_TEXT: Final = b'"text"'
"""A completions stream's text key."""
_USAGE_KEY: Final = b'"usage"'
_USAGE: Final = re.compile(rb'"usage"\s*:\s*\{')
_NO_CHOICES: Final = re.compile(rb'"choices"\s*:\s*\[\s*\]')
MAX_EVENT_BYTES: Final = 4 * 1024 * 1024  # default cap of one event held back [bytes]


def token_events(region: bytes, completions: bool = False) -> int:
    """How many token events ``region`` (whole events) holds (see the module docstring): in a
    chat stream, how often ``"content"`` or ``"reasoning_content"`` opens a string that is not
    empty, or ``"tool_calls"`` an array that is not; in a completions stream (``completions``),
    ``"text"`` a string. JSON's white space is allowed around the colon (engines write none;
    Python's json module one space). A key's quotes are the JSON's own: inside a string they
    would be escaped. Found by one ``bytes.split`` per key (:func:`_starts`), which skips through
    the bytes between keys far faster than a regular expression tries each of them."""
    if completions:
        return _strings_after(region, _TEXT, b"")
    return _strings_after(region, _CONTENT, _REASONING) + _arrays_after(region, _TOOL_CALLS)


def _strings_after(region: bytes, key: bytes, prefix: bytes) -> int:
    """How often ``key`` opens a string that is not empty, where ``key`` starts with a quote
    or (``prefix`` not empty) follows a quote or ``prefix`` directly."""
    count, end = 0, len(region)
    for at in _starts(region, key):
        if not prefix or (at > 0 and region[at - 1] == 0x22) or \
                region.endswith(prefix, 0, at):
            value = _value_at(region, at + len(key))
            if 0 <= value < end and region[value] == 0x22 and (  # '"', then not '"'
                    value + 1 == end or region[value + 1] != 0x22):
                count += 1
    return count


def _arrays_after(region: bytes, key: bytes) -> int:
    """How often ``key`` opens an array that is not empty."""
    count, end = 0, len(region)
    for at in _starts(region, key):
        value = _value_at(region, at + len(key))
        if 0 <= value < end and region[value] == 0x5B:  # "[", then not "]"
            inside = _space_from(region, value + 1)
            if inside == end or region[inside] != 0x5D:
                count += 1
    return count


def _starts(region: bytes, key: bytes) -> list[int]:
    """Where ``key`` starts in ``region``, each time, from one split (one builtin call, where a
    find per occurrence would be one call each)."""
    parts = region.split(key)
    starts: list[int] = []
    at = -len(key)
    for i in range(len(parts) - 1):
        at += len(key) + len(parts[i])
        starts.append(at)
    return starts


def _space_from(region: bytes, at: int) -> int:
    """The index of the first byte at or after ``at`` that is not JSON white space."""
    end = len(region)
    while at < end:
        byte = region[at]
        if byte != 0x20 and byte != 0x0A and byte != 0x0D and byte != 0x09:  # " \n\r\t"
            break
        at += 1
    return at


def _value_at(region: bytes, at: int) -> int:
    """Where the value after a key ending at ``at`` starts (past the colon and the white space
    around it); -1 when no colon follows (the key was a string value)."""
    at = _space_from(region, at)
    if at == len(region) or region[at] != 0x3A:  # ":"
        return -1
    return _space_from(region, at + 1)


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
        if buffer.partition(_USAGE_KEY)[1] and _USAGE.search(buffer):
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
