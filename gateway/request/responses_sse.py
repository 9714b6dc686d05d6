"""The Responses API's stream, relayed byte for byte and watched like a chat stream.

vLLM 0.32 (``vllm/entrypoints/openai/responses/api_router.py``,
``_convert_stream_to_sse_events``) writes each event as ``event: <type>`` then ``data: <json>``
and a blank line; a text answer is ``response.created``, ``response.in_progress``,
``response.output_item.added``, ``response.content_part.added``, one
``response.output_text.delta`` per engine step (``"delta": "<text>"``),
``response.output_text.done``, ``response.content_part.done``, ``response.output_item.done``
and ``response.completed``, whose ``response`` holds the whole answer and its ``usage``
(``input_tokens``, ``output_tokens``, ``total_tokens``, ``input_tokens_details.cached_tokens``).
There is no ``[DONE]`` line and nothing to cut: ridge never asks a Responses stream for usage.

:class:`ResponsesScanner` keeps :class:`~gateway.request.sse.StreamScanner`'s interface and its
hold-back of an incomplete trailing event; per complete region, by byte search:

- token events: those with a non-empty string ``"delta"`` (text, reasoning and tool-argument
  deltas — the ``*.done`` events repeat the whole text and are not counted), for the time to
  the first token and the inter-token gaps;
- the usage: the event holding a ``"usage": {`` object (``response.completed``, or
  ``response.incomplete`` / ``response.failed``), parsed with ``json.loads`` and given in the
  chat API's names (:func:`chat_usage`) so that the proxy reads one kind of usage.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gateway.request.sse import StreamScanner, _events_with

_DELTA = re.compile(rb'"delta"\s*:\s*"(?!")')
_USAGE = re.compile(rb'"usage"\s*:\s*\{')


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
        if n := len(_DELTA.findall(buffer)):
            self._tokens(n)
        if b'"usage"' in buffer and _USAGE.search(buffer):
            self._take_usage(buffer)
        return buffer

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
