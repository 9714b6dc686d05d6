"""What a simulated model answers: fresh pseudo-words, or its prompt's text where it is asked
to repeat it.

Speculative decoding by prompt look-up (:mod:`backends.sim.ngram`) gains only where the answer
repeats text the sequence already holds, so the simulated answer must be able to copy. A copy
request (a :data:`COPY_DIRECTIVE` word before the passage of the prompt's last turn,
:func:`copy_span`) is answered with the passage's tokens, each replaced by a fresh word with
probability ``slip``; anything else is free text, fresh words from
:data:`backends.sim.tokens.VOCAB` except for runs that repeat earlier positions of the sequence
(a share ``repeat_share`` of the text from token ``repeat_after`` on, runs of mean length
``repeat_run``). Drawn as needed, deterministic for the request's generator.

Parameters (:class:`Style`, the pool's ``simulator.copy_slip``, ``repeat_share``,
``repeat_run_tokens``, ``repeat_after_tokens``): probabilities in [0, 1), lengths in tokens.
See docs/simulator.md#answers for the run arithmetic.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from backends.sim import tokens

COPY_DIRECTIVE = re.compile(
    r"\b(?:repeat|copy|echo|reproduce|rewrite|transcribe|duplicate|recite)\b[^:\n]*[:\n]",
    re.IGNORECASE,
)
"""A request to repeat what follows (matched in the prompt's last turn, case-insensitive)."""

END_OF_TURN: tuple[str, ...] = ("<|im_end|>", "<|eot_id|>", "<|end|>", "</s>", "<end_of_turn>")
"""End-of-turn markers of common chat templates: a passage ends at the first one after it."""

TURN_START: tuple[str, ...] = ("<|im_start|>", "<|start_header_id|>", "<start_of_turn>")
"""Start-of-turn markers: the last turn begins after the last one."""


def copy_span(prompt: Sequence[str]) -> tuple[int, int] | None:
    """Token indices [start, end) of the passage the prompt's last turn asks to repeat, or
    None (:func:`_token_range` at its edges)."""
    text = "".join(prompt)
    turn = _last_turn_start(text)
    match = COPY_DIRECTIVE.search(text, turn)
    if match is None:
        return None
    stop = min((i for m in END_OF_TURN if (i := text.find(m, match.end())) >= 0),
               default=len(text))
    return _token_range(prompt, match.end(), stop)


def _last_turn_start(text: str) -> int:
    """Where the last turn that is not the generation prompt starts (0 without markers)."""
    starts = sorted(i for m in TURN_START for i in _all(text, m))
    if len(starts) >= 2 and not any(text.find(e, starts[-1]) >= 0 for e in END_OF_TURN):
        return starts[-2]  # the last start opens the assistant's (empty) turn
    return starts[-1] if starts else 0


def _all(text: str, marker: str) -> list[int]:
    out, i = [], text.find(marker)
    while i >= 0:
        out.append(i)
        i = text.find(marker, i + 1)
    return out


def _token_range(prompt: Sequence[str], start: int, stop: int) -> tuple[int, int] | None:
    """The tokens from the one holding character ``start`` to the last one ending by ``stop``
    (a token that runs into the end-of-turn marker is not part of the passage)."""
    first = last = None
    offset = 0
    for i, token in enumerate(prompt):
        end = offset + len(token)
        if first is None and end > start:
            first = i
        if first is not None and end <= stop:
            last = i + 1
        offset = end
    return (first, last) if first is not None and last is not None and last > first else None


@dataclass(frozen=True, slots=True)
class Style:
    """How a model's answers copy and repeat (module docstring). ``slip``: chance a copied
    token is a fresh word; ``repeat_share``: share of free-text tokens repeating earlier text;
    ``repeat_run``: mean length of such a repeat [tokens]; ``repeat_after``: answer tokens
    before the first repeat [tokens]."""

    slip: float = 0.0
    repeat_share: float = 0.0
    repeat_run: float = 1.0
    repeat_after: int = 0

    def __post_init__(self) -> None:
        if not (0.0 <= self.slip < 1.0 and 0.0 <= self.repeat_share < 1.0
                and self.repeat_run >= 1.0 and self.repeat_after >= 0):
            raise ValueError(f"invalid answer style {self}")

    @property
    def run_start(self) -> float:
        """p, the chance a run starts at a fresh token: share ÷ (run · (1 − share))."""
        share = self.repeat_share
        return min(1.0, share / (self.repeat_run * (1.0 - share))) if share else 0.0


PLAIN = Style()


class Answer:
    """The tokens one request's model samples, position by position (module docstring)."""

    __slots__ = ("_copy", "_style", "_rng", "_tokens", "_prompt", "_source")

    def __init__(self, rng: random.Random, copy: Sequence[str] = (), style: Style = PLAIN,
                 prompt: Sequence[str] = ()) -> None:
        self._copy, self._style, self._rng = tuple(copy), style, rng
        self._prompt = tuple(prompt)  # a copy: the caller's list goes on to hold the answer
        self._tokens: list[str] = []
        self._source: int | None = None  # the sequence position a repeat run copies next

    @classmethod
    def for_prompt(cls, prompt: Sequence[str], rng: random.Random, style: Style) -> Answer:
        span = copy_span(prompt)
        return cls(rng, prompt[span[0]:span[1]] if span else (), style, prompt)

    def natural_length(self) -> int | None:
        """A copy's own length [tokens] (None for free text: the engine's stop law decides)."""
        return len(self._copy) or None

    def tokens(self, start: int, count: int) -> list[str]:
        """Answer tokens [start, start + count)."""
        out = self._tokens
        while len(out) < start + count:
            out.append(self._next(len(out)))
        return out[start:start + count]

    def _next(self, i: int) -> str:
        style, rng = self._style, self._rng
        if i < len(self._copy):
            if style.slip and rng.random() < style.slip:
                return tokens.words(rng, 1)[0]
            return self._copy[i]
        if not style.repeat_share or i < style.repeat_after:
            return tokens.words(rng, 1)[0]
        return self._free(rng, style)

    def _free(self, rng: random.Random, style: Style) -> str:
        """A free-text token: the next of a repeat run, a run's first, or a fresh word."""
        prompt, out = self._prompt, self._tokens
        length = len(prompt) + len(out)
        src = self._source
        if src is not None and rng.random() >= 1.0 / style.repeat_run:
            self._source = src + 1
            return prompt[src] if src < len(prompt) else out[src - len(prompt)]
        if length > 1 and rng.random() < style.run_start:
            src = rng.randrange(length - 1)
            self._source = src + 1
            return prompt[src] if src < len(prompt) else out[src - len(prompt)]
        self._source = None
        return tokens.words(rng, 1)[0]
