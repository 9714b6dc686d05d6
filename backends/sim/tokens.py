"""Prompt text, the token estimate, and the pseudo-words the simulator "generates".

Estimate: a token is 4 characters of the rendered prompt (:data:`CHARS_PER_TOKEN`), token t
its characters [4t, 4t + 4). Chat prompts are rendered with a ChatML template
(:func:`render_chat`), each header and content padded to a multiple of 4 characters, and
generated tokens are 4-character :data:`VOCAB` words, so a reply sent back in the next turn
lines up with the tokens the engine cached. Generated text is drawn per request from a seeded
``random.Random`` (:func:`words`).

When the fleet file names a tokenizer for the pool's model, prompts are tokenized as the real
engine does (:func:`model_tokens`, :mod:`routing.tokens.exact`), so ``usage.prompt_tokens``
equals the real engine's. See docs/simulator.md#tokens.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from routing.tokens import counters
from routing.tokens.exact import PromptTokenizer

CHARS_PER_TOKEN = int(counters.CHARS_PER_TOKEN)
"""The gateway's default estimate (:data:`routing.tokens.counters.CHARS_PER_TOKEN`), whole: the
simulated tokenizer cuts prompts into chunks of exactly this many characters."""
assert CHARS_PER_TOKEN == counters.CHARS_PER_TOKEN, "the simulated tokenizer needs a whole ratio"

_WORDS = """
the and for are but not you all any can had her was one our out day get has him his how man new
now old see two way who boy did its let put say she too use sun sky sea oak elm fig ink jam key
kit lab map net oil owl pen pot ray rod rug sap tap tin van wax web yak zip arc bee cup dew elk
"""
VOCAB: tuple[str, ...] = tuple(" " + w for w in _WORDS.split())
"""Generated-token vocabulary: 72 distinct words of exactly ``CHARS_PER_TOKEN`` characters."""


def estimate_tokens(text: str) -> int:
    """Estimated token count of ``text``: ⌈len(text) / 4⌉."""
    return -(-len(text) // CHARS_PER_TOKEN)


def pad_to_token(text: str, fill: str = " ") -> str:
    """``text`` padded with ``fill`` to a whole number of tokens (a multiple of 4 characters)."""
    return text + fill * (-len(text) % CHARS_PER_TOKEN)


TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
"""Content part types that carry text: the chat API's and the Responses API's."""


def content_text(content: Any) -> str:
    """A message's text: a string, or the ``text`` of its text parts (other parts ignored)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") in TEXT_PARTS
        )
    return ""


def render_chat(messages: Sequence[Mapping[str, Any]], tools: Any = None) -> str:
    """The ChatML prompt for ``messages`` (and ``tools`` as a leading JSON segment), padded so
    every content starts on a token boundary, ending with the assistant generation prompt."""
    parts: list[str] = []
    if tools:
        parts.append(_segment("tools", json.dumps(tools, sort_keys=True)))
    parts.extend(
        _segment(str(m.get("role", "user")), content_text(m.get("content"))) for m in messages
    )
    parts.append(pad_to_token("<|im_start|>assistant\n"))
    return "".join(parts)


def _segment(role: str, content: str) -> str:
    return pad_to_token(f"<|im_start|>{role}\n") + pad_to_token(content + "<|im_end|>\n")


def completion_prompt_text(prompt: Any) -> str | None:
    """The text of a completions ``prompt``: a string, a one-element list of strings, or a list of
    token ids (rendered as one 4-character chunk per id). None when it is anything else."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return "".join(f"{t % 10000:04d}" for t in prompt)
    return None


def model_tokens(
    tokenizer: PromptTokenizer, kind: str, body: Mapping[str, Any]
) -> list[str] | None:
    """The prompt of a ``chat`` or ``completion`` request ``body`` as the model's own tokens (each
    token's text), or None when the model's tokenizer does not model it (module docstring)."""
    prompt = model_prompt(tokenizer, kind, body)
    return None if prompt is None else prompt[0]


def model_prompt(
    tokenizer: PromptTokenizer, kind: str, body: Mapping[str, Any]
) -> tuple[list[str], Sequence[int]] | None:
    """:func:`model_tokens` and the token ids they are the text of (the ids the engine computes
    and names in its KV-cache events), or None."""
    ids = tokenizer.prompt_ids(body, "chat" if kind == "chat" else "completions")
    return None if ids is None else ([tokenizer.token_text(i) for i in ids], ids)


def stream_tokens(prompt: str) -> list[str]:
    """The prompt's tokens: 4-character chunks, the last one padded with NULs to 4 characters."""
    padded = pad_to_token(prompt, "\0")
    return [padded[i : i + CHARS_PER_TOKEN] for i in range(0, len(padded), CHARS_PER_TOKEN)]


def words(rng: random.Random, count: int) -> list[str]:
    """``count`` pseudo-words drawn from ``VOCAB``."""
    return [VOCAB[rng.randrange(len(VOCAB))] for _ in range(count)]


def join(tokens: Iterable[str]) -> str:
    return "".join(tokens)
