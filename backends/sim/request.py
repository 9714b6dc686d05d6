"""One request inside a simulated engine: what it asks for and where it is in the engine.

A request's token stream is its prompt tokens followed by the tokens generated so far. Invariants
the engine keeps: ``num_computed`` tokens have their KV in ``blocks``; while decoding,
``num_computed == len(tokens) - 1`` (the last sampled token is computed by the next step).
Times are simulated seconds on the engine's clock.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from backends.sim.answers import Answer
from backends.sim.ngram import NgramIndex


class Phase(Enum):
    WAITING = "waiting"
    TRANSFERRING = "transferring"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False, slots=True)
class RemoteKV:
    """Decode side of prefill/decode disaggregation: the prompt's KV comes from another engine.

    ``published_at`` is when the prefill engine finished (None until it has); the KV then takes
    ``kv bytes ÷ link_bandwidth`` seconds to arrive. ``release`` tells the prefill engine it may
    free its copy once the transfer is done.
    """

    link_bandwidth: float
    published_at: float | None = None
    release: Callable[[], None] | None = None
    ready_at: float | None = None
    transfer_tokens: int = 0


@dataclass(eq=False, slots=True)
class SimRequest:
    """A generation request (n = 1) and its progress. ``answer``: the tokens its model samples
    (:mod:`backends.sim.answers`; the engine gives one of fresh words when None). n-gram
    speculation: ``drafter`` indexes the sequence for prompt look-up (:mod:`backends.sim.ngram`)
    and ``drafts`` holds the drafts proposed for the next step (None for other methods: the
    engine drafts K). ``prompt_ids``: the prompt's token ids when the model's tokenizer counted
    it (None for the estimate), for the KV-cache events (:mod:`backends.sim.kv_events`)."""

    rid: str
    tokens: list[str]
    prompt_tokens: int
    max_tokens: int
    finish_reason: str
    arrival: float
    rng: random.Random
    available_at: float = 0.0
    requested_max_tokens: int = 0
    hold_kv: bool = False
    remote: RemoteKV | None = None
    on_finish: Callable[[SimRequest], None] | None = None
    phase: Phase = Phase.WAITING
    num_computed: int = 0
    blocks: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)
    named_blocks: int = 0
    cached_tokens: int = 0
    transferred_tokens: int = 0
    counted_prompt: bool = False
    first_scheduled: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    final_reason: str | None = None
    preemptions: int = 0
    answer: Answer | None = None
    drafter: NgramIndex | None = None
    drafts: list[str] | None = None
    prompt_ids: Sequence[int] | None = None

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_tokens

    @property
    def remaining(self) -> int:
        """Tokens still to generate."""
        return self.max_tokens - self.generated

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed < len(self.tokens) - 1 or self.generated == 0
