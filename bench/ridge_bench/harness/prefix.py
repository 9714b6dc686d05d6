"""Prefix sharing of a stream of chat requests, as ridge's router measures it: f.

Canonical text and block hashes are ridge's own (:func:`routing.features.canonical_prompt`,
:func:`routing.features.block_hashes`): every message of the request in order (the whole
conversation, not only its first message), cut into blocks of ``block_tokens`` × 4 characters
(4 characters per estimated token), hash i chained over blocks 0..i, so equal hash i means
equal blocks 0..i. Only whole blocks count, as in an engine's paged prefix cache (vLLM hashes
16-token blocks on GPUs).

The prefix share f of a stream of requests (:class:`PrefixTracker`): for each request, its
matched tokens are ``block_tokens`` × the number of its leading blocks whose hash any earlier
request of the stream already produced; f = Σ matched tokens / Σ prompt tokens (estimated
tokens, ⌈characters / 4⌉). It is the hit rate of an ideal, unbounded prefix cache shared by the
whole fleet: the best any cache-aware router could do on that stream.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from routing.features import block_hashes, canonical_prompt

CHARS_PER_TOKEN = 4
DEFAULT_BLOCK_TOKENS = 16

Message = Mapping[str, str]


def canonical_text(messages: Sequence[Message]) -> str:
    """The whole conversation as ridge's router renders it (see the module doc)."""
    return canonical_prompt({"messages": list(messages)}, "chat")


def prompt_tokens(text: str) -> int:
    """Estimated tokens: ⌈characters / 4⌉."""
    return -(-len(text) // CHARS_PER_TOKEN)


@dataclass
class PrefixTracker:
    """f over a stream of requests (module doc). ``seen`` grows with the stream: one entry per
    distinct block, so a benchmark run of N requests holds at most N × prompt blocks."""

    block_tokens: int = DEFAULT_BLOCK_TOKENS
    prompt_tokens: int = 0
    matched_tokens: int = 0
    requests: int = 0
    seen: set[int] = field(default_factory=set)

    def observe(self, messages: Sequence[Message]) -> int:
        """Count one request; returns its matched tokens."""
        text = canonical_text(messages)
        hashes = block_hashes(text, self.block_tokens * CHARS_PER_TOKEN)
        matched = 0
        for h in hashes:
            if h not in self.seen:
                break
            matched += 1
        self.seen.update(hashes)
        tokens = prompt_tokens(text)
        self.requests += 1
        self.prompt_tokens += tokens
        self.matched_tokens += matched * self.block_tokens
        return matched * self.block_tokens

    @property
    def f(self) -> float:
        """Σ matched / Σ prompt tokens (0 before any request)."""
        return self.matched_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
