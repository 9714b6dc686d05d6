"""Prompt token counts: a documented estimate by default, a real tokenizer when configured.

:class:`CharEstimate` (the default) counts ``ceil(characters / chars_per_token)`` with
``chars_per_token = 4``: the usual ratio of English text under the BPE tokenizers of current
chat models (roughly 3.5-4.5 characters per token; code and non-Latin scripts run denser, so
the estimate then counts too few tokens). It costs nothing and needs no model files.

:class:`HFTokenizerCounter` counts a text exactly with a Hugging Face ``tokenizer.json``
through the ``tokenizers`` package (a plain tokenizer library, no model runtime). The package is
optional: it is imported only when such a counter is built, and :func:`tokenizers_available`
tells whether it can be. A text is not a request, though: what the engine counts is the chat
template's rendering of the request, which :class:`PromptIds` (implemented by
:mod:`routing.tokens.exact`) gives.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

CHARS_PER_TOKEN = 4.0  # characters per token, English text under BPE tokenizers


def estimate_tokens(chars: int, chars_per_token: float = CHARS_PER_TOKEN) -> int:
    """Tokens in ``chars`` characters by the estimate: ⌈chars ÷ ``chars_per_token``⌉ (rounded
    up: a non-empty text is at least one token). The one character estimate of the project: the
    router's :class:`CharEstimate` and the gateway's sizes of a request body both use it."""
    return math.ceil(chars / chars_per_token)


class TokenCounter(Protocol):
    """Counts the tokens of a text (sync, pure, cheap: it runs once per request)."""

    def count(self, text: str) -> int: ...


class PromptIds(Protocol):
    """A model's exact prompt token ids, as the engine computes them from the whole request
    (:class:`routing.tokens.exact.PromptTokenizer`); None when the request is not modelled."""

    def prompt_ids(self, payload: Mapping[str, Any], kind: str) -> Sequence[int] | None: ...


@dataclass(frozen=True, slots=True)
class CharEstimate:
    """Tokens ≈ ceil(characters / ``chars_per_token``)."""

    chars_per_token: float = CHARS_PER_TOKEN

    def __post_init__(self) -> None:
        if self.chars_per_token <= 0:
            raise ValueError("chars_per_token must be positive")

    def count(self, text: str) -> int:
        return estimate_tokens(len(text), self.chars_per_token)


def tokenizers_available() -> bool:
    """Whether the optional ``tokenizers`` package can be imported."""
    return importlib.util.find_spec("tokenizers") is not None


class HFTokenizerCounter:
    """Exact token counts from a Hugging Face tokenizer (``tokenizers.Tokenizer``).

    Special tokens are not added: the canonical prompt already stands for the chat template's
    role markers.
    """

    __slots__ = ("_tokenizer",)

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    @classmethod
    def from_file(cls, path: str | Path) -> HFTokenizerCounter:
        """Load ``tokenizer.json``; raises ImportError when ``tokenizers`` is not installed."""
        module = importlib.import_module("tokenizers")
        return cls(module.Tokenizer.from_file(str(path)))

    def count(self, text: str) -> int:
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        return len(ids)
