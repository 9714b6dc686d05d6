"""Deterministic text for the router benchmark's workloads: prose, JSON tool schemas, documents.

Every function takes a ``random.Random`` and draws only from it, so the same seed gives the same
text. Sizes are in estimated tokens, one token per ``CHARS_PER_TOKEN`` (4) characters, the
estimate the simulator and ridge's features use when no tokeniser is configured; a real
tokeniser counts English prose at about that rate (≈ 0.75 words per token).

Text is built from :data:`WORDS` (ordinary English words) so prompts look like prose, and long
texts carry per-draw numbers (ids, amounts), so two independently drawn texts never share a
long run of characters by accident: the only shared prefixes in a workload are the ones it
builds on purpose (system prompts, documents, conversation histories).
"""

from __future__ import annotations

import json
import random
from typing import Any

from gateway.plan.trace import WORDS

CHARS_PER_TOKEN = 4


_VERB_TEXT = """
check find list update create cancel verify compare summarise explain review schedule send
fetch compute validate approve reject merge split archive restore estimate track notify
"""
VERBS: tuple[str, ...] = tuple(_VERB_TEXT.split())


def estimate_tokens(text: str) -> int:
    """Estimated tokens of ``text``: ⌈characters / 4⌉."""
    return -(-len(text) // CHARS_PER_TOKEN)


def sentence(rng: random.Random, words: int) -> str:
    """A capitalised sentence of ``words`` words, ending with a full stop."""
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return body[:1].upper() + body[1:] + "."


def paragraph(rng: random.Random, sentences: int) -> str:
    """``sentences`` sentences of 8 to 20 words, one of them carrying a reference number."""
    parts = [sentence(rng, rng.randint(8, 20)) for _ in range(sentences)]
    parts[rng.randrange(sentences)] += f" Ref {rng.randrange(10**6):06d}."
    return " ".join(parts)


def prose(rng: random.Random, tokens: int) -> str:
    """Paragraphs until the text reaches at least ``tokens`` estimated tokens."""
    out: list[str] = []
    while estimate_tokens("\n\n".join(out)) < tokens:
        out.append(paragraph(rng, rng.randint(3, 6)))
    return "\n\n".join(out)


def text(rng: random.Random, tokens: int) -> str:
    """Prose cut to exactly ``tokens`` estimated tokens (``tokens`` × 4 characters)."""
    return prose(rng, tokens)[: tokens * CHARS_PER_TOKEN]


def tool_schema(rng: random.Random) -> dict[str, Any]:
    """One OpenAI-style function tool definition with 2 to 5 typed parameters."""
    name = f"{rng.choice(VERBS)}_{rng.choice(WORDS)}_{rng.choice(WORDS)}"
    props: dict[str, Any] = {}
    for _ in range(rng.randint(2, 5)):
        props[f"{rng.choice(WORDS)}_{rng.choice(WORDS)}"] = _parameter(rng)
    required = sorted(rng.sample(sorted(props), k=max(1, len(props) // 2)))
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": sentence(rng, rng.randint(10, 24)),
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


def _parameter(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(("string", "integer", "number", "boolean", "enum"))
    described = {"description": sentence(rng, rng.randint(5, 12))}
    if kind == "enum":
        return {"type": "string", "enum": rng.sample(WORDS, k=rng.randint(3, 6)), **described}
    return {"type": kind, **described}


def tool_schemas_json(rng: random.Random, tokens: int) -> str:
    """A JSON array of tool definitions (indented, as agent frameworks print them into the
    system prompt) of at least ``tokens`` estimated tokens."""
    tools: list[dict[str, Any]] = []
    while estimate_tokens(json.dumps(tools, indent=1)) < tokens:
        tools.append(tool_schema(rng))
    return json.dumps(tools, indent=1)


def tool_result_json(rng: random.Random, tokens: int) -> str:
    """A tool's JSON answer (records with ids, amounts and notes) of at least ``tokens`` tokens."""
    rows: list[dict[str, Any]] = []
    while estimate_tokens(json.dumps(rows)) < tokens:
        rows.append({
            "id": f"{rng.choice(WORDS)}-{rng.randrange(10**8):08d}",
            "status": rng.choice(("open", "closed", "pending", "failed", "done")),
            "amount": round(rng.uniform(1, 10_000), 2),
            "note": sentence(rng, rng.randint(4, 12)),
        })
    return json.dumps({"ok": True, "rows": rows})


def document(rng: random.Random, tokens: int) -> str:
    """A titled document of sections of prose, at least ``tokens`` estimated tokens."""
    title = " ".join(rng.choice(WORDS) for _ in range(4)).title()
    sections: list[str] = [f"# {title} (doc {rng.randrange(10**6):06d})"]
    while estimate_tokens("\n\n".join(sections)) < tokens:
        heading = " ".join(rng.choice(WORDS) for _ in range(3)).title()
        sections.append(f"## {heading}\n\n{paragraph(rng, rng.randint(4, 8))}")
    return "\n\n".join(sections)


def question(rng: random.Random) -> str:
    """A question about a document."""
    return (f"Question {rng.randrange(10**6):06d}: {rng.choice(VERBS)} the "
            f"{rng.choice(WORDS)} and the {rng.choice(WORDS)} described in the document, "
            f"and say which {rng.choice(WORDS)} matters most for the {rng.choice(WORDS)}.")
