"""The simulated endpoint's prompt tokens: the model's own tokenizer and chat template when it
has them (as the real engine counts), else the 4-character estimate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from backends.sim import start_fleet, tokens
from backends.sim.clock import VirtualClock
from backends.sim.endpoint import SimEndpoint, TokenizedGeneration
from backends.sim.openai_api import ApiError
from backends.sim.pd import KVTransferHub
from backends.sim.pooling import tokenize
from config.fleet import parse_fleet
from routing.tokens.exact import PromptTokenizer, load_prompt_tokenizer
from tests.fakes.harness import free_ports
from tests.unit.backends.sim.sim_helpers import make_pool

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from tests.fakes.tiny_model import model_folder  # noqa: E402 - needs the tokenizers package


@pytest.fixture
def tiny(tmp_path: Path) -> PromptTokenizer:
    return load_prompt_tokenizer(model_folder(tmp_path / "model"))


def endpoint(tokenizer: PromptTokenizer | None) -> SimEndpoint:
    return SimEndpoint(make_pool(), 0, 1, VirtualClock(), KVTransferHub(), 0, tokenizer)


def chat(text: str, **fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], **fields}


def test_a_chat_is_counted_with_the_models_tokenizer_and_template(
    tiny: PromptTokenizer,
) -> None:
    ep = endpoint(tiny)
    gen = ep.parse("chat", chat("hello world", max_tokens=4))
    # <|im_start|> user hello world <|im_end|> <|im_start|> assistant
    assert isinstance(gen, TokenizedGeneration) and gen.prompt_tokens == 7
    assert gen.pieces[:3] == ("<|im_start|>", "user", "hello") and gen.max_tokens == 4
    estimated = endpoint(None).parse("chat", chat("hello world", max_tokens=4))
    assert estimated.prompt_tokens == tokens.estimate_tokens(estimated.prompt) == 17
    req = ep._request(gen, "r1")
    assert req.prompt_tokens == 7 and req.tokens == list(gen.pieces)


def test_a_completion_gets_the_tokenizers_bos(tiny: PromptTokenizer) -> None:
    gen = endpoint(tiny).parse("completion", {"prompt": "hello world"})
    assert gen.prompt_tokens == 3 and gen.max_tokens == 16  # <s> hello world; vLLM's default


def test_the_context_is_checked_on_the_exact_count(tiny: PromptTokenizer) -> None:
    ep = endpoint(tiny)  # 8192 tokens of context
    fits = ep.parse("chat", chat("hello " * 6000))  # ~9000 by the estimate, 6005 exactly
    assert fits.prompt_tokens == 6005 and fits.max_tokens == 8192 - 6005
    # vLLM states where its tokenizer stopped: one past the context
    with pytest.raises(ApiError, match="your prompt contains at least 8193 input tokens"):
        ep.parse("chat", chat("hello " * 9000))
    # 6005 + 2200 > 8192: vLLM generates the 2187 that fit
    assert ep.parse("chat", chat("hello " * 6000, max_completion_tokens=2200)).max_tokens == 2187
    # a prompt of 8190 tokens leaves 2 to generate: max_tokens 3 is cut to 2
    assert ep.parse("chat", chat("hello " * 8185, max_tokens=3)).max_tokens == 2
    with pytest.raises(ApiError, match="max_completion_tokens=9000 cannot be greater than"):
        ep.parse("chat", chat("hello", max_completion_tokens=9000))
    with pytest.raises(ApiError, match="'loc': 'body.messages'"):
        ep.parse("chat", {"messages": "hi"})  # the engine's own validation still runs


def test_a_request_the_tokenizer_does_not_model_keeps_the_estimate(
    tiny: PromptTokenizer,
) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:,"}}
    gen = endpoint(tiny).parse("chat", {"messages": [{"role": "user", "content": [image]}]})
    assert not isinstance(gen, TokenizedGeneration)
    assert gen.prompt_tokens == tokens.estimate_tokens(gen.prompt)


async def test_the_fleet_gives_each_pool_its_models_tokenizer(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "model")
    pool = make_pool().model_dump(exclude_none=True)
    ports = free_ports(2)
    raw = {"pools": [{**pool, "name": "a", "endpoints": [f"http://127.0.0.1:{ports[0]}"]},
                     {**pool, "name": "b", "models": ["other"],
                      "endpoints": [f"http://127.0.0.1:{ports[1]}"]}],
           "routing": {"features": {"tokenizers": {"m": str(folder)}}}}
    running = await start_fleet(parse_fleet(raw))
    try:
        a, b = (s.endpoint for s in running.servers)
        assert a.tokenizer is not None and b.tokenizer is None
        assert a.parse("chat", chat("hello")).prompt_tokens == 6
    finally:
        await running.stop()


def test_the_prompt_ids_are_the_models_own_else_the_simulators_tokens(
    tiny: PromptTokenizer,
) -> None:
    exact = endpoint(tiny).parse("chat", chat("hello world"))
    assert isinstance(exact, TokenizedGeneration)
    assert endpoint(tiny).prompt_ids(exact) == exact.ids and len(exact.ids) == 7
    ep = endpoint(None)
    estimated = ep.parse("chat", chat("hello world"))
    ids = tokenize({"messages": chat("hello world")["messages"]}, ep.dialect, ep.info)["tokens"]
    assert list(ep.prompt_ids(estimated)) == ids and len(ids) == estimated.prompt_tokens
