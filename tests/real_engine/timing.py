"""Time streamed chat completions with the official ``openai`` client, sync and async.

Definitions (seconds, tokens):
- TTFT: from sending the request to the first chunk that carries generated text;
- decode rate: tokens after the first / (time of the last text chunk − time of the first),
  the token count taken from the usage chunk (``stream_options.include_usage``), so chunks that
  carry several tokens (speculative decoding) are counted right.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from openai import AsyncOpenAI, OpenAI
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam


@dataclass(frozen=True, slots=True)
class StreamResult:
    """One streamed completion. Times in seconds from the request's start."""

    ttft_s: float
    last_token_s: float
    prompt_tokens: int
    completion_tokens: int
    text: str

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first per second of decoding (0 when there is nothing to time)."""
        span = self.last_token_s - self.ttft_s
        if self.completion_tokens < 2 or span <= 0:
            return 0.0
        return (self.completion_tokens - 1) / span


class _Recorder:
    """Accumulates chunks as they arrive."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.first: float | None = None
        self.last = 0.0
        self.parts: list[str] = []
        self.usage: tuple[int, int] | None = None

    def on_chunk(self, chunk: ChatCompletionChunk) -> None:
        now = time.perf_counter() - self.start
        for choice in chunk.choices:
            if choice.delta.content:
                self.first = now if self.first is None else self.first
                self.last = now
                self.parts.append(choice.delta.content)
        if chunk.usage is not None:
            self.usage = (chunk.usage.prompt_tokens, chunk.usage.completion_tokens)

    def result(self) -> StreamResult:
        if self.first is None or self.usage is None:
            raise AssertionError("stream carried no text or no usage chunk")
        return StreamResult(self.first, self.last, *self.usage, "".join(self.parts))


def _kwargs(model: str, messages: Iterable[ChatCompletionMessageParam], max_tokens: int,
            extra_body: Mapping[str, Any] | None) -> dict[str, Any]:
    return {
        "model": model, "messages": list(messages), "max_tokens": max_tokens, "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True},
        "extra_body": dict(extra_body or {}),
    }  # fmt: skip


def stream_chat(client: OpenAI, model: str, messages: Iterable[ChatCompletionMessageParam],
                max_tokens: int, extra_body: Mapping[str, Any] | None = None) -> StreamResult:
    """One greedy streamed chat completion, timed."""
    recorder = _Recorder()
    stream = client.chat.completions.create(**_kwargs(model, messages, max_tokens, extra_body))
    for chunk in stream:
        recorder.on_chunk(chunk)
    return recorder.result()


async def astream_chat(
    client: AsyncOpenAI,
    model: str,
    messages: Iterable[ChatCompletionMessageParam],
    max_tokens: int,
    extra_body: Mapping[str, Any] | None = None,
) -> StreamResult:
    """As :func:`stream_chat`, with the async client."""
    recorder = _Recorder()
    stream = await client.chat.completions.create(**_kwargs(model, messages, max_tokens,
                                                            extra_body))
    async for chunk in stream:
        recorder.on_chunk(chunk)
    return recorder.result()
