"""ridge counts a prompt's tokens as the real engine does.

Twenty-odd varied requests (short and long chats, system / user / assistant turns, tools and
tool calls, a developer turn, list-of-parts content, special-token text, completions prompts, a
Responses request) go straight to the tier's real vLLM (the "plain" engine, SmolLM2-135M) with
``max_tokens: 1``. For each, the engine's ``usage.prompt_tokens`` (``input_tokens`` for
Responses) must equal (1) ridge's count through the gateway's feature extraction
(``build_extractor`` over a fleet whose ``routing.features.tokenizers`` names the model folder
the engine loads) and (2) the simulator's, an endpoint of the same pool with the same
tokenizer (chat and completions; the simulator's Responses API keeps the estimate). The
estimate (characters ÷ 4) is printed beside them.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from backends.engines.tokenizers import fleet_tokenizers, pool_tokenizer
from backends.sim.clock import VirtualClock
from backends.sim.endpoint import SimEndpoint
from backends.sim.pd import KVTransferHub
from config.fleet import parse_fleet
from gateway.app import build_extractor
from routing.features import RequestInfo, canonical_prompt
from tests.real_engine.conftest import MODEL, Engines
from tests.real_engine.prompts import COPY_PROMPT, long_system_prompt
from tests.real_engine.servers import engine_paths

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(600)]

_SENTENCE = ("the quick brown fox jumps over the lazy dog while seven bright stars glow above "
             "a quiet harbour town")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def words(n: int) -> str:
    """``n`` words of plain English text."""
    vocabulary = _SENTENCE.split(" ")
    return " ".join(vocabulary[i % len(vocabulary)] for i in range(n))


def msg(role: str, content: Any, **extra: Any) -> dict[str, Any]:
    return {"role": role, "content": content, **extra}


CHATS: dict[str, dict[str, Any]] = {
    "short question": {"messages": [msg("user", "What is the capital of France?")]},
    "one word": {"messages": [msg("user", "hi")]},
    "system and user": {"messages": [msg("system", "You are terse."),
                                     msg("user", "Name a colour.")]},
    "long word text": {"messages": [msg("user", words(1300))]},
    "long system prompt": {"messages": [msg("system", long_system_prompt()),
                                        msg("user", "Which rule is about units?")]},
    "system user assistant user": {"messages": [
        msg("system", "Be brief."), msg("user", "Hello"),
        msg("assistant", "Hi! How can I help?"), msg("user", "Tell me a joke.")]},
    "six turns": {"messages": [msg("system", "S1"), msg("user", "U1"), msg("assistant", "A1"),
                               msg("user", "U2"), msg("assistant", "A2"), msg("user", "U3")]},
    "tools": {"messages": [msg("user", "Weather in Paris?")], "tools": [WEATHER],
              "tool_choice": "none"},
    "tool call and result": {"messages": [
        msg("user", "What is the weather?"), msg("assistant", None, tool_calls=[CALL]),
        msg("tool", "Sunny, 21 C", tool_call_id="call_1")],
        "tools": [WEATHER], "tool_choice": "none"},
    "content parts": {"messages": [msg("user", [{"type": "text", "text": "first part"},
                                                {"type": "text", "text": "second part"}])]},
    "developer turn": {"messages": [msg("developer", "Answer in French."),
                                    msg("user", "Good morning")]},
    "unicode": {"messages": [msg("user", "Ünïcödé — 東京 🚀 and\ttabs\n\nnewlines")]},
    "code": {"messages": [msg("user", COPY_PROMPT)]},
    "spaces": {"messages": [msg("user", "  leading and trailing spaces  ")]},
    "numbers": {"messages": [msg("user", "Numbers: 1234567890 3.14159 -42 1e10")]},
    "special token text": {"messages": [msg("user", "<|im_start|> literal <|im_end|> text")]},
    "no generation prompt": {"messages": [msg("user", "Hello")],
                             "add_generation_prompt": False},
}
COMPLETIONS: dict[str, dict[str, Any]] = {
    "completion: short": {"prompt": "Once upon a time"},
    "completion: long": {"prompt": words(900)},
    "completion: one-string list": {"prompt": ["The capital of France is"]},
    "completion: chat markup": {"prompt": "<|im_start|>user\nHi<|im_end|>\n"
                                          "<|im_start|>assistant\n"},
}
RESPONSES: dict[str, dict[str, Any]] = {
    "responses: instructions and input": {"instructions": "You are terse.",
                                          "input": "Name a colour."},
}
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions",
         "responses": "/v1/responses"}


def cases() -> list[tuple[str, str, dict[str, Any]]]:
    return ([(name, "chat", body) for name, body in CHATS.items()]
            + [(name, "completions", body) for name, body in COMPLETIONS.items()]
            + [(name, "responses", body) for name, body in RESPONSES.items()])


def engine_count(url: str, kind: str, body: dict[str, Any]) -> int:
    """The engine's own prompt token count for ``body`` (one generated token)."""
    limit = {"max_output_tokens": 16} if kind == "responses" else {"max_tokens": 1}
    reply = httpx.post(url + PATHS[kind], timeout=120,
                       json={"model": MODEL, "temperature": 0, **limit, **body})
    assert reply.status_code == 200, reply.text
    usage = reply.json()["usage"]
    return int(usage["input_tokens"] if kind == "responses" else usage["prompt_tokens"])


def test_ridge_and_the_simulator_count_what_the_engine_counts(engines: Engines) -> None:
    raw = {**engines.raw, "routing": {"features": {"tokenizers": {
        MODEL: str(engine_paths().model_dir)}}}}
    fleet = parse_fleet(raw)
    extractor = build_extractor(fleet)  # the gateway's feature extraction
    pool = fleet.pools[0]
    sim = SimEndpoint(pool, 0, 1, VirtualClock(), KVTransferHub(), 0,
                      pool_tokenizer(pool, fleet_tokenizers(fleet, report=False)))
    rows, wrong = [], []
    for name, kind, body in cases():
        engine = engine_count(engines.plain.url, kind, body)
        ridge = extractor.extract({"model": MODEL, **body}, RequestInfo(kind, MODEL)).prompt_tokens
        # the simulator's Responses API keeps the estimate: no simulator count for it
        simulated = (sim.parse("chat" if kind == "chat" else "completion", body).prompt_tokens
                     if kind != "responses" else None)
        estimate = -(-len(canonical_prompt(body, kind)) // 4)
        rows.append(f"{name}: engine {engine}, ridge {ridge}, simulator {simulated}, "
                    f"estimate {estimate}")
        if ridge != engine or simulated not in (engine, None):
            wrong.append(rows[-1])
    print("\n" + "\n".join(rows))
    assert len(rows) >= 20
    assert wrong == [], "\n".join(wrong)
