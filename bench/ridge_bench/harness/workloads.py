"""The router benchmark's named workloads: agent, rag, chat and mixed, deterministic for a seed.

A workload is conversation sources, one per kind, and an open-loop arrival schedule. Conversation
``i`` of a kind is drawn from its own ``random.Random`` (``"{seed}:{kind}:{i}"``): a fixed prefix
and a list of user turns, the assistant's replies appended at run time. Kinds: **agent** (long
shared system prompts with tool schemas, multi-turn, tool results fed back), **rag** (hot
documents asked several questions), **chat** (unique short prompts, long answers),
**mixed** (all three by :data:`MIXED_WEIGHTS`, in rising load steps) and **chat_ramp**
(chat in rising load steps).

Arrivals are a Poisson process per load step from ``Random("{seed}:arrivals")``, kinds by
smooth weighted round-robin (:func:`kind_sequence`), independent of how fast the fleet answers.
Units: estimated tokens (4 characters each), requests/s, seconds.
See docs/benchmarks/router.md#workloads-in-detail.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from ridge_bench.harness import corpus
from ridge_bench.harness.prefix import Message, PrefixTracker

AGENT, RAG, CHAT, MIXED, CHAT_RAMP = "agent", "rag", "chat", "mixed", "chat_ramp"
KINDS = (AGENT, RAG, CHAT)
NAMES = (AGENT, RAG, CHAT, MIXED, CHAT_RAMP)
MIXED_WEIGHTS: Mapping[str, float] = MappingProxyType({AGENT: 0.5, RAG: 0.3, CHAT: 0.2})

Range = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Turn:
    """One user message and the reply length asked for it (``max_tokens``)."""

    content: str
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Conversation:
    """A prefix (system prompt, ...) and the user turns that follow it, in order."""

    key: str
    kind: str
    prefix: tuple[Message, ...]
    turns: tuple[Turn, ...]


class Source(Protocol):
    """Conversations of one kind, by index (deterministic)."""

    @property
    def kind(self) -> str: ...

    def conversation(self, index: int) -> Conversation: ...


def _rng(seed: int, *parts: object) -> random.Random:
    return random.Random(":".join(str(p) for p in (seed, *parts)))


@dataclass(frozen=True)
class AgentSource:
    """Agent conversations (module doc). ``systems`` are built once from the seed."""

    seed: int
    systems: tuple[str, ...]
    turns: Range = (3, 6)
    task_tokens: Range = (40, 120)
    result_tokens: Range = (450, 900)
    max_tokens: Range = (48, 128)
    kind: str = AGENT

    def conversation(self, index: int) -> Conversation:
        rng = _rng(self.seed, self.kind, index)
        system = self.systems[rng.randrange(len(self.systems))]
        task = f"Task {index:06d}: {corpus.text(rng, rng.randint(*self.task_tokens))}"
        turns = [Turn(task, rng.randint(*self.max_tokens))]
        for k in range(1, rng.randint(*self.turns)):
            result = corpus.tool_result_json(rng, rng.randint(*self.result_tokens))
            turns.append(Turn(f"Tool result (call {k}): {result}", rng.randint(*self.max_tokens)))
        return Conversation(f"{self.kind}-{index:06d}", self.kind,
                            ({"role": "system", "content": system},), tuple(turns))


def agent_source(seed: int, systems: int = 4, system_tokens: int = 1000,
                 tool_tokens: int = 700) -> AgentSource:
    """An :class:`AgentSource` with ``systems`` system prompts of instructions + tool schemas."""
    prompts = []
    for s in range(systems):
        rng = _rng(seed, "agent-system", s)
        prompts.append(
            f"You are agent {s} of the operations team.\n\n{corpus.prose(rng, system_tokens)}"
            f"\n\nYou can call these tools. Answer with one tool call as JSON, or with the final "
            f"answer.\n{corpus.tool_schemas_json(rng, tool_tokens)}"
        )
    return AgentSource(seed, tuple(prompts))


@dataclass(frozen=True)
class RagSource:
    """Questions about shared documents (module doc). Questions come in groups of
    ``window`` × ``questions``: group g asks documents g·window .. g·window + window − 1, each
    ``questions`` times, in an order shuffled by ``Random("{seed}:rag-order:{g}")`` (a fixed
    rotation would line up with a round-robin router's and flatter it)."""

    seed: int
    doc_tokens: Range = (2000, 3200)
    questions: int = 6
    window: int = 4
    max_tokens: Range = (96, 192)
    kind: str = RAG

    def document_of(self, index: int) -> int:
        group, offset = divmod(index, self.window * self.questions)
        order = [d for d in range(self.window) for _ in range(self.questions)]
        _rng(self.seed, "rag-order", group).shuffle(order)
        return group * self.window + order[offset]

    def conversation(self, index: int) -> Conversation:
        doc = self.document_of(index)
        drng = _rng(self.seed, "rag-doc", doc)
        text = corpus.document(drng, drng.randint(*self.doc_tokens))
        rng = _rng(self.seed, self.kind, index)
        system = ("Answer from the context only. Quote the section you used. If the context "
                  "does not say, answer that it does not.")
        user = f"Context:\n{text}\n\n{corpus.question(rng)}"
        return Conversation(f"{self.kind}-{index:06d}", self.kind,
                            ({"role": "system", "content": system},),
                            (Turn(user, rng.randint(*self.max_tokens)),))


@dataclass(frozen=True)
class ChatSource:
    """Unique short prompts asking for long answers (module doc)."""

    seed: int
    prompt_tokens: Range = (20, 150)
    max_tokens: Range = (256, 512)
    kind: str = CHAT

    def conversation(self, index: int) -> Conversation:
        rng = _rng(self.seed, self.kind, index)
        text = (f"Request {index:06d}: write a detailed essay about this. "
                f"{corpus.text(rng, rng.randint(*self.prompt_tokens))}")
        return Conversation(f"{self.kind}-{index:06d}", self.kind, (),
                            (Turn(text, rng.randint(*self.max_tokens)),))


@dataclass(frozen=True, slots=True)
class LoadStep:
    """``rate`` requests/s (Poisson) for ``duration_s`` seconds."""

    rate: float
    duration_s: float


@dataclass(frozen=True, slots=True)
class Arrival:
    """A request slot: when (seconds from the start), in which load step, of which kind."""

    at_s: float
    step: int
    kind: str


@dataclass(frozen=True)
class Workload:
    """Sources plus the arrival schedule (module doc)."""

    name: str
    seed: int
    sources: Mapping[str, Source]
    weights: Mapping[str, float]
    steps: tuple[LoadStep, ...]
    notes: Mapping[str, str] = field(default_factory=dict)

    def arrivals(self, limit: int) -> list[Arrival]:
        """The first ``limit`` arrivals of the schedule (fewer if the steps end first)."""
        rng = _rng(self.seed, "arrivals")
        kinds = kind_sequence(self.weights)
        out: list[Arrival] = []
        start = 0.0
        for index, step in enumerate(self.steps):
            t = start
            while len(out) < limit:
                t += rng.expovariate(step.rate)
                if t >= start + step.duration_s:
                    break
                out.append(Arrival(t, index, next(kinds)))
            start += step.duration_s
        return out


def kind_sequence(weights: Mapping[str, float]) -> Iterator[str]:
    """Kinds in proportion to ``weights``, evenly spread: smooth weighted round-robin (each
    turn every kind gains its weight, the kind with the most credit goes and pays the total;
    ties go to the kind listed first). Any run of n arrivals then holds each kind within one
    arrival of n × its share, so every load step gets the same mix."""
    credit = dict.fromkeys(weights, 0.0)
    total = sum(weights.values())
    while True:
        for kind, weight in weights.items():
            credit[kind] += weight
        best = max(round(c, 9) for c in credit.values())  # float noise must not break ties
        chosen = next(k for k, c in credit.items() if round(c, 9) == best)
        credit[chosen] -= total
        yield chosen


def build(name: str, seed: int, rate: float, duration_s: float, steps: int = 3) -> Workload:
    """The named workload at ``rate`` requests/s (stepped ones: the heaviest step's rate)."""
    if name not in NAMES:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(NAMES)}")
    if rate <= 0 or duration_s <= 0 or steps < 1:
        raise ValueError("rate and duration must be positive, steps at least 1")
    all_sources: dict[str, Source] = {
        AGENT: agent_source(seed), RAG: RagSource(seed), CHAT: ChatSource(seed)}
    ladder = tuple(LoadStep(rate * k / steps, duration_s / steps) for k in range(1, steps + 1))
    if name == MIXED:
        return Workload(name, seed, all_sources, MIXED_WEIGHTS, ladder)
    if name == CHAT_RAMP:
        return Workload(name, seed, {CHAT: all_sources[CHAT]}, {CHAT: 1.0}, ladder)
    return Workload(name, seed, {name: all_sources[name]}, {name: 1.0},
                    (LoadStep(rate, duration_s),))


def placeholder_reply(key: str, turn: int, tokens: int) -> str:
    """Stand-in for an engine's reply of ``tokens`` tokens, unique to (conversation, turn)."""
    rng = random.Random(f"reply:{key}:{turn}")
    return corpus.text(rng, tokens)


def full_messages(conv: Conversation, turn: int, replies: list[str]) -> list[Message]:
    """Messages of ``conv``'s turn ``turn`` (0-based) given the replies to the earlier turns."""
    messages: list[Message] = list(conv.prefix)
    for k in range(turn):
        messages.append({"role": "user", "content": conv.turns[k].content})
        messages.append({"role": "assistant", "content": replies[k]})
    messages.append({"role": "user", "content": conv.turns[turn].content})
    return messages


def source_tracker(source: Source, conversations: int) -> PrefixTracker:
    """f over every turn of the first ``conversations`` conversations, replies stood in by
    :func:`placeholder_reply` of ``max_tokens`` tokens (the engine's own replies are as long
    and just as new to every cache)."""
    tracker = PrefixTracker()
    for i in range(conversations):
        conv = source.conversation(i)
        replies: list[str] = []
        for k, turn in enumerate(conv.turns):
            tracker.observe(full_messages(conv, k, replies))
            replies.append(placeholder_reply(conv.key, k, turn.max_tokens))
    return tracker


def theoretical_f(workload: Workload, conversations: int = 48) -> float:
    """The workload's prefix share f by construction: per kind, f over the first
    ``conversations`` conversations (:func:`source_tracker`); kinds combined by their arrival
    weights w: f = Σ w·(matched per request) / Σ w·(prompt tokens per request)."""
    matched = prompt = 0.0
    for kind, weight in workload.weights.items():
        t = source_tracker(workload.sources[kind], conversations)
        matched += weight * t.matched_tokens / t.requests
        prompt += weight * t.prompt_tokens / t.requests
    return matched / prompt if prompt else 0.0
