"""gateway.server.exchange: an ASGI request as an Exchange (its body within a limit, a client
that leaves, its responses as ASGI messages) and the OpenAI-shaped error response."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gateway.server.errors import GatewayError
from gateway.server.exchange import (
    WATCH,
    AsgiExchange,
    ClientGone,
    DisconnectWatch,
    chunk,
    error_response,
    read_body,
)


@pytest.mark.parametrize("size", [1, 15, 16, 1023, 1024, 4096, 70000])
def test_a_chunk_is_its_size_in_hex_then_its_data(size: int) -> None:
    data = b"x" * size
    assert chunk(data) == f"{size:x}\r\n".encode() + data + b"\r\n"


async def test_read_body_refuses_a_declared_size_at_once_and_a_client_that_leaves() -> None:
    async def never() -> dict[str, Any]:
        raise AssertionError("the body must not be read")

    with pytest.raises(GatewayError):
        await read_body(never, 10, True)

    async def gone() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    with pytest.raises(ClientGone):
        await read_body(gone, 10, False)


def exchange(messages: list[dict[str, Any]], headers: list[tuple[bytes, bytes]],
             extensions: dict[str, Any] | None = None) -> tuple[AsgiExchange, list[Any]]:
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()
        raise AssertionError

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "headers": headers, "extensions": extensions or {}}
    return AsgiExchange(scope, receive, send, lambda _: None), sent


async def test_an_asgi_body_in_pieces_past_the_limit_is_a_413() -> None:
    pieces = [{"type": "http.request", "body": b"12345", "more_body": True},
              {"type": "http.request", "body": b"678", "more_body": False}]
    ok, _ = exchange(list(pieces), [])
    assert await ok.body(8) == b"12345678"
    refused, _ = exchange(list(pieces), [(b"content-length", b"8")])
    with pytest.raises(GatewayError) as exc:
        await refused.body(7)
    assert exc.value.status == 413 and exc.value.code == "request_too_large"


async def test_asgi_responses_are_messages_with_their_length_or_in_pieces() -> None:
    whole, sent = exchange([], [])
    await whole.respond(201, [(b"content-type", b"application/json")], b"{}")
    assert sent == [{"type": "http.response.start", "status": 201, "headers": [
        (b"content-type", b"application/json"), (b"content-length", b"2")]},
        {"type": "http.response.body", "body": b"{}"}]
    stream, sent = exchange([], [])
    assert await stream.start(200, [(b"content-type", b"text/event-stream")]) is None
    await stream.send(b"data: 1\n\n", more=True)
    await stream.send(b"", more=False)
    assert [m.get("more_body") for m in sent[1:]] == [True, False]


async def test_a_watch_fires_through_the_scope_or_a_disconnect_message() -> None:
    watch = DisconnectWatch()
    through_scope, _ = exchange([], [], {WATCH: watch})
    fired: list[str] = []
    stop = through_scope.watch(lambda: fired.append("scope"))
    watch.fire()
    stop()
    through_receive, _ = exchange([{"type": "http.disconnect"}], [])
    through_receive.watch(lambda: fired.append("receive"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert fired == ["scope", "receive"]
    assert through_receive.task is asyncio.current_task()


def test_an_error_response_is_openai_shaped_and_a_405_names_the_method() -> None:
    status, headers, body = error_response(
        GatewayError(405, "no", code="method_not_allowed", headers=((b"retry-after", b"1"),)),
        b"req-1")
    assert status == 405 and json.loads(body)["error"]["code"] == "method_not_allowed"
    assert headers == [(b"content-type", b"application/json"), (b"retry-after", b"1"),
                       (b"x-request-id", b"req-1"), (b"allow", b"POST")]
