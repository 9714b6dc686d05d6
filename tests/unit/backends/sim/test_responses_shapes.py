"""The Responses API's answers as the simulator writes them: the response object and its
event stream, read back by the official openai client's own types."""

from __future__ import annotations

import json

from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from backends.sim.responses_shapes import EventStream, Turn, response, usage

TURN = Turn("resp_1", "msg_1", 1_700_000_000, "m", {"instructions": "Be brief.", "user": "u"})


def test_a_finished_response_is_openais_response() -> None:
    body = response(TURN, "Hello!", "stop", 16, usage(5, 2))
    parsed = Response.model_validate(body)
    assert (parsed.status, parsed.output_text, parsed.instructions, parsed.user) == (
        "completed", "Hello!", "Be brief.", "u")
    assert parsed.usage is not None and parsed.usage.total_tokens == 7
    cut = response(TURN, "Hel", "length", 1, usage(5, 1))
    assert cut["status"] == "incomplete"
    assert cut["incomplete_details"] == {"reason": "max_output_tokens"}


def test_the_stream_is_numbered_events_the_client_reads() -> None:
    events = EventStream(TURN)
    raw = (events.opening(16) + events.first_text() + events.delta("Hel") + events.delta("lo")
           + events.closing("Hello", "stop", 16, usage(5, 2)))
    blocks = [b for b in raw.split(b"\n\n") if b]
    adapter: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)
    parsed = []
    for block in blocks:
        head, data = block.split(b"\n", 1)
        payload = json.loads(data.removeprefix(b"data: "))
        assert head == f"event: {payload['type']}".encode()
        assert list(payload) == sorted(payload)  # as the events' models declare them
        parsed.append(adapter.validate_python(payload))
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    assert [e.type for e in parsed] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert parsed[-1].response.output_text == "Hello"  # type: ignore[union-attr]
