"""The Responses API (``POST /v1/responses``) as vLLM 0.32 answers it, field for field.

A whole answer is one response object (:func:`response`: ``resp_`` id, the output message,
``status`` ``completed`` or ``incomplete``, ``usage`` and the request's echoed settings); a
stream (:class:`EventStream`) is vLLM's sequence of events, each ``event: <type>`` +
``data: <json>`` + a blank line (:func:`event`), numbered by ``sequence_number``, from
``response.created`` to ``response.completed``, without a ``[DONE]`` line. Field names and
order were checked against a real vLLM stream (``tests/real_engine/test_real_vllm_surface.py``).

See docs/simulator.md#the-responses-api for the event sequence and the sources.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backends.sim.behaviour import JSON


@dataclass(frozen=True, slots=True)
class Turn:
    """One Responses request's identity: response and message ids, creation time [s since the
    epoch], model, and the request body (its settings are echoed)."""

    response_id: str
    message_id: str
    created_at: int
    model: str
    body: Mapping[str, Any]


def event(obj: JSON) -> bytes:
    """One server-sent event as vLLM writes it: its type, then its JSON."""
    return f"event: {obj['type']}\ndata: ".encode() + json.dumps(
        obj, separators=(",", ":")).encode() + b"\n\n"


def usage(prompt: int, output: int, cached: int = 0) -> JSON:
    """The usage object (the per-turn lists are empty for a plain, one-turn answer)."""
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0,
                                 "input_tokens_per_turn": [], "cached_tokens_per_turn": []},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0,
                                  "output_tokens_per_turn": [],
                                  "tool_output_tokens_per_turn": []},
        "total_tokens": prompt + output,
    }


def text_part(text: str) -> JSON:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": None}


def message(turn: Turn, text: str | None, status: str) -> JSON:
    """The assistant's output message (no content part before its first text)."""
    content = [] if text is None else [text_part(text)]
    return {"id": turn.message_id, "content": content, "role": "assistant", "status": status,
            "type": "message", "phase": None}


def response(turn: Turn, text: str | None, finish: str | None, max_tokens: int,
             use: JSON | None) -> JSON:
    """The response object: in progress (``finish`` None, no output yet) or finished."""
    body = turn.body
    tools = body.get("tools") or []
    status = "in_progress" if finish is None else (
        "incomplete" if finish == "length" else "completed")
    output = [] if finish is None else [message(turn, text, "completed")]
    return {
        "id": turn.response_id, "created_at": turn.created_at,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions"), "metadata": body.get("metadata"),
        "model": turn.model, "object": "response", "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature", 1.0),
        "tool_choice": body.get("tool_choice", "auto" if tools else "none"),
        "tools": tools, "top_p": body.get("top_p", 1.0),
        "background": body.get("background", False), "max_output_tokens": max_tokens,
        "max_tool_calls": None, "previous_response_id": body.get("previous_response_id"),
        "prompt": None, "reasoning": None, "service_tier": body.get("service_tier", "auto"),
        "status": status, "text": None, "top_logprobs": None,
        "truncation": body.get("truncation", "disabled"), "usage": use, "user": body.get("user"),
        "presence_penalty": 0.0, "frequency_penalty": 0.0, "kv_transfer_params": None,
        "ec_transfer_params": None, "input_messages": None, "output_messages": None,
    }


class EventStream:
    """Numbers the events of one stream (``sequence_number`` from 0) and writes them."""

    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        self._next = 0

    def _numbered(self, obj: JSON) -> bytes:
        """``obj`` with the next sequence number, its fields in alphabetical order (the order
        the events' models declare them in, which their JSON keeps)."""
        numbered = dict(sorted({**obj, "sequence_number": self._next}.items()))
        self._next += 1
        return event(numbered)

    def opening(self, max_tokens: int) -> bytes:
        """``response.created`` and ``response.in_progress``."""
        state = response(self.turn, None, None, max_tokens, None)
        return b"".join(self._numbered({"response": state, "type": kind})
                        for kind in ("response.created", "response.in_progress"))

    def first_text(self) -> bytes:
        """The message and its text part, announced before the first delta."""
        item = message(self.turn, None, "in_progress")
        part = {"annotations": [], "text": "", "type": "output_text", "logprobs": []}
        return (self._numbered({"item": item, "output_index": 0,
                                "type": "response.output_item.added"})
                + self._numbered({"content_index": 0, "item_id": self.turn.message_id,
                                  "output_index": 0, "part": part,
                                  "type": "response.content_part.added"}))

    def delta(self, text: str) -> bytes:
        return self._numbered({"content_index": 0, "delta": text,
                               "item_id": self.turn.message_id, "logprobs": [],
                               "output_index": 0, "type": "response.output_text.delta"})

    def closing(self, text: str, finish: str, max_tokens: int, use: JSON) -> bytes:
        """The ``*.done`` events and ``response.completed``."""
        ids = {"item_id": self.turn.message_id, "output_index": 0}
        return b"".join((
            self._numbered({"content_index": 0, **ids, "logprobs": [], "text": text,
                            "type": "response.output_text.done"}),
            self._numbered({"content_index": 0, **ids, "part": text_part(text),
                            "type": "response.content_part.done"}),
            self._numbered({"item": message(self.turn, text, "completed"), "output_index": 0,
                            "type": "response.output_item.done"}),
            self._numbered({"response": response(self.turn, text, finish, max_tokens, use),
                            "type": "response.completed"}),
        ))
