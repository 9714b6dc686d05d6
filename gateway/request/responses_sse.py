"""The Responses API's stream, relayed byte for byte and watched like a chat stream.

vLLM writes each event as ``event: <type>`` then ``data: <json>`` and a blank line, ending with
``response.completed`` (the whole answer and its usage) and no ``[DONE]``; ridge never asks a
Responses stream for usage, so nothing is cut. :class:`ResponsesScanner` keeps
:class:`~gateway.request.sse.StreamScanner`'s interface and hold-back; by byte search it times
the events with a non-empty ``"delta"`` (first token, inter-token gaps) and parses the event
holding ``"usage"``, given in the chat API's names (:func:`chat_usage`).

See docs/gateway.md#responses-api-streams for the event sequence.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gateway.request.answers import responses_stream_ended
from gateway.request.event_keys import holds_usage
from gateway.request.sse import _USAGE, StreamScanner, _events_with

_DELTA = re.compile(rb'"delta"\s*:\s*"(?!")')


def chat_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """A Responses API usage object in the chat API's names (``prompt_tokens``,
    ``completion_tokens``, ``total_tokens``, ``prompt_tokens_details.cached_tokens``);
    ``usage`` itself when it has no Responses figures."""
    if "input_tokens" not in usage and "output_tokens" not in usage:
        return usage
    details = usage.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return {
        "prompt_tokens": usage.get("input_tokens"),
        "completion_tokens": usage.get("output_tokens"),
        "total_tokens": usage.get("total_tokens"),
        "prompt_tokens_details": None if cached is None else {"cached_tokens": cached},
    }


class ResponsesScanner(StreamScanner):
    """Relays a Responses API stream and watches it (module docstring). ``strip_usage`` is
    taken for the interface's sake: nothing is ever cut from this stream."""

    __slots__ = ()

    def feed(self, chunk: bytes) -> bytes:
        """The bytes of ``chunk`` (after what was held back) to relay now."""
        buffer = self._whole_events(chunk)
        if not buffer:
            return b""
        self._last = buffer
        if n := len(_DELTA.findall(buffer)):
            self._tokens(n)
        if holds_usage(buffer) and _USAGE.search(buffer):
            self._take_usage(buffer)
        return buffer

    def _ends(self, region: bytes) -> bool:
        return responses_stream_ended(region)

    def _take_usage(self, region: bytes) -> None:
        for start, end in _events_with(region, _USAGE):
            usage = _response_usage(region[start:end])
            if usage is not None:
                self.usage = chat_usage(usage)


def _response_usage(event: bytes) -> dict[str, Any] | None:
    """The ``response.usage`` object of one event, if it has one."""
    for line in event.splitlines():
        if line.startswith(b"data:"):
            try:
                data = json.loads(line[5:])
            except ValueError:
                return None
            response = data.get("response") if isinstance(data, dict) else None
            usage = response.get("usage") if isinstance(response, dict) else None
            return usage if isinstance(usage, dict) else None
    return None
