"""The keys a streamed region's events are read for, found by byte search, never by parsing.

A region is whole server-sent events of a chat or completions stream (its ``data:`` lines are
JSON). :func:`chat_tokens` counts the chat stream's token events: how often ``"content"`` or
``"reasoning_content"`` opens a string that is not empty, or ``"tool_calls"`` an array that is
not; :func:`text_tokens` a completions stream's, ``"text"`` opening a string. JSON's white space
is allowed around the colon. A key's quotes are the JSON's own: inside a string they would be
escaped, so generated text cannot fake a key. :func:`holds_usage` says whether ``"usage"``
occurs at all (the gate before the usage event's regular expression).

This file is the reference. ``make native`` also builds ``event_keys.c``, the same functions in
C, into an extension module beside it, which Python imports in its place
(:mod:`gateway.native`): each is one call a region with no Python-level search call inside, and
the tests hold both to the same results. See docs/gateway.md#streams.
"""

from __future__ import annotations

_CONTENT = b'content"'
"""The end of the chat text keys, ``"content"`` and ``"reasoning_content"``: one search finds
both."""
_REASONING = b'"reasoning_'
_TOOL_CALLS = b'"tool_calls"'
_TEXT = b'"text"'
_USAGE_KEY = b'"usage"'


def chat_tokens(region: bytes) -> int:
    """How many token events a region of a chat stream holds (module docstring)."""
    return _strings_after(region, _CONTENT, _REASONING) + _arrays_after(region, _TOOL_CALLS)


def text_tokens(region: bytes) -> int:
    """How many token events a region of a completions stream holds (module docstring)."""
    return _strings_after(region, _TEXT, b"")


def holds_usage(region: bytes) -> bool:
    """Whether ``"usage"`` occurs in ``region``."""
    return bool(region.partition(_USAGE_KEY)[1])  # partition: the cheapest call; never `in`


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
    """Where ``key`` starts in ``region``, left to right, each occurrence past the last one
    found, from one split (one builtin call, where a find per occurrence is one each)."""
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
