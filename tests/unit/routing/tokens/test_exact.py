"""Exact prompt tokens (routing.tokens.exact) with tokenizers built here in memory: a word-level
one with ChatML special tokens (worked numbers) and a small byte-level BPE (the segment cache
against whole-text encoding)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing.features import (
    FeatureExtractor,
    RequestInfo,
    canonical_prompt,
    token_block_hashes,
)
from routing.tokens.exact import (
    PromptTokenizer,
    SegmentEncoder,
    load_prompt_tokenizer,
    responses_as_chat,
    segments_independent,
)

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from tests.fakes.tiny_model import (  # noqa: E402 - needs the tokenizers package
    CHATML,
    CONFIG,
    SPECIALS,
    model_folder,
    word_tokenizer,
)

TOOLS_TEMPLATE = "{% for t in tools %}tool {% endfor %}{{ messages[0]['content'] }}"


@pytest.fixture
def smol(tmp_path: Path) -> PromptTokenizer:
    return load_prompt_tokenizer(model_folder(tmp_path / "model", CONFIG))


def chat(*messages: tuple[str, str], **fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": r, "content": c} for r, c in messages], **fields}


def test_a_chat_counts_the_template_and_its_special_tokens(smol: PromptTokenizer) -> None:
    payload = chat(("system", "you are terse"), ("user", "hello world"))
    # <|im_start|> system you are terse <|im_end|> <|im_start|> user hello world <|im_end|>
    # <|im_start|> assistant: 13 tokens; the canonical text's estimate says ⌈48 / 4⌉ = 12, and
    # the template's own text is what the engine counts.
    ids = smol.chat_ids(payload)
    assert ids is not None and list(ids) == [12, 1, 4, 5, 6, 13, 12, 2, 7, 8, 13, 12, 3]


def test_chat_adds_no_bos_but_completions_do(smol: PromptTokenizer) -> None:
    assert list(smol.completion_ids("hello world") or []) == [10, 7, 8]  # <s> hello world
    assert list(smol.completion_ids(["hello"]) or []) == [10, 7]
    assert list(smol.completion_ids([5, 6]) or []) == [5, 6]  # token ids as given
    assert smol.completion_ids(["a", "b"]) is None
    ids = smol.chat_ids(chat(("user", "hello")))
    assert ids is not None and ids[0] == 12  # the template's <|im_start|>, no <s>


def test_without_add_bos_token_the_tokenizers_own_post_processor_stays(tmp_path: Path) -> None:
    plain = load_prompt_tokenizer(model_folder(tmp_path, {"bos_token": "<s>"}))
    assert list(plain.completion_ids("hello") or []) == [7]


def test_add_eos_token_appends_eos(tmp_path: Path) -> None:
    config = {"bos_token": "<s>", "eos_token": "</s>", "add_eos_token": True}
    both = load_prompt_tokenizer(model_folder(tmp_path, config))
    assert list(both.completion_ids("hello world") or []) == [7, 8, 11]


def test_the_template_file_wins_over_the_config_and_a_configured_file_over_both(
    tmp_path: Path,
) -> None:
    folder = model_folder(tmp_path / "m", CONFIG, template_file="hello {{ bos_token }}")
    assert load_prompt_tokenizer(folder).render_chat(chat(("user", "x"))) == "hello <s>"
    mine = tmp_path / "mine.jinja"
    mine.write_text("world")
    assert load_prompt_tokenizer(folder, mine).render_chat(chat(("user", "x"))) == "world"


def test_a_tokenizer_json_path_finds_the_files_beside_it(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, CONFIG)
    tok = load_prompt_tokenizer(folder / "tokenizer.json")
    assert len(tok.chat_ids(chat(("user", "hello"))) or []) == 6


def test_named_templates_pick_tool_use_for_a_request_with_tools(tmp_path: Path) -> None:
    config = {"chat_template": [{"name": "default", "template": CHATML},
                                {"name": "tool_use", "template": TOOLS_TEMPLATE}]}
    tok = load_prompt_tokenizer(model_folder(tmp_path, config))
    tool = {"type": "function", "function": {"name": "f"}}
    assert tok.render_chat(chat(("user", "hello"), tools=[tool, tool])) == "tool tool hello"
    assert tok.render_chat(chat(("user", "hello"))) == \
        "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"


def test_without_a_template_chat_is_not_modelled_but_text_is_counted(tmp_path: Path) -> None:
    tok = load_prompt_tokenizer(model_folder(tmp_path, {}))
    assert tok.chat_ids(chat(("user", "hello"))) is None
    assert tok.count("hello world <|im_end|>") == 3
    assert "no chat template" in tok.describe()


def test_responses_requests_render_as_their_chat(smol: PromptTokenizer) -> None:
    responses = {"instructions": "you are terse", "input": "hello world"}
    as_chat = chat(("system", "you are terse"), ("user", "hello world"))
    assert smol.prompt_ids(responses, "responses") == smol.prompt_ids(as_chat, "chat")
    items = {"input": [{"role": "user", "content": [{"type": "input_text", "text": "hello"}]}]}
    assert len(smol.prompt_ids(items, "responses") or []) == 6
    assert responses_as_chat({"input": [{"type": "function_call_output", "output": "x"}]}) is None
    assert responses_as_chat({"input": "x", "previous_response_id": "r1"}) is None


def test_requests_not_modelled_give_none(smol: PromptTokenizer) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:,"}}
    assert smol.prompt_ids({"messages": [{"role": "user", "content": [image]}]}, "chat") is None
    assert smol.prompt_ids({"input": ["x"]}, "embeddings") is None


def test_text_the_tokenizer_refuses_is_not_modelled_but_still_counted(
    smol: PromptTokenizer,
) -> None:
    lone = "hello \ud800 world"  # a lone surrogate: valid JSON, not valid UTF-8
    assert smol.prompt_ids(chat(("user", lone)), "chat") is None
    assert smol.count(lone) == 3  # hello, [UNK] for U+FFFD, world
    got = FeatureExtractor(counters={"m": smol}, exact={"m": smol}).extract(
        chat(("user", lone)), RequestInfo("chat", "m"))
    assert got.prompt_tokens == 3  # the canonical text, counted: three pieces between spaces


def test_token_text_is_each_tokens_text(smol: PromptTokenizer) -> None:
    assert [smol.token_text(i) for i in (12, 7)] == ["<|im_start|>", "hello"]


def test_the_extractor_counts_and_hashes_the_exact_tokens(smol: PromptTokenizer) -> None:
    extractor = FeatureExtractor(exact={"m": smol})
    payload = chat(("system", "you are terse"), ("user", "hello world"))
    got = extractor.extract(payload, RequestInfo("chat", "m"))
    ids = smol.chat_ids(payload)
    assert ids is not None and got.prompt_tokens == 13 and got.block_tokens == 16
    assert got.block_hashes == ()  # 13 tokens: no full 16-token block
    long = chat(("user", "hello " * 40))
    got = extractor.extract(long, RequestInfo("chat", "m"))
    assert got.prompt_tokens == 45  # 40 words + 5 template tokens
    assert got.block_hashes == token_block_hashes(smol.chat_ids(long) or [], 16, "m")
    assert len(got.block_hashes) == 2


def test_a_request_not_modelled_falls_back_to_the_models_text_count(
    smol: PromptTokenizer,
) -> None:
    extractor = FeatureExtractor(counters={"m": smol}, exact={"m": smol})
    image = {"type": "image_url", "image_url": {"url": "data:,"}}
    payload = {"messages": [{"role": "user", "content": [image, {"type": "text",
                                                                 "text": "hello world"}]}]}
    got = extractor.extract(payload, RequestInfo("chat", "m"))
    assert got.prompt_tokens == smol.count(canonical_prompt(payload, "chat")) == 2
    assert got.block_tokens == 16  # from the canonical text's characters, not its tokens


# -- the segment cache ---------------------------------------------------------------------

def byte_level_bpe(specials: list[str]) -> Any:
    """A byte-level BPE (GPT-2's pre-tokenizer) trained here on a few sentences."""
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    corpus = ["the quick brown fox jumps over the lazy dog", "hello world, hello there!",
              "def f(x):\n    return x * 2", "numbers 1234 and 3.14", "ünïcödé 東京"] * 20
    tok.train_from_iterator(corpus, trainer)
    return tok


BPE = byte_level_bpe(SPECIALS)
PIECES = st.sampled_from(["the", " quick", "  ", "\n", "\t", "fox!", "12", "34", "é", "東",
                          "x*2", "'s", " 's", "<|im_start|>", "<|im_end|>", "<s>", "<|im", "|>"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(PIECES, max_size=12).map("".join), min_size=1, max_size=4))
def test_segment_wise_ids_equal_whole_text_ids(texts: list[str]) -> None:
    tok = PromptTokenizer(BPE)
    assert tok.segment_cache
    for text in texts * 2:  # the second round from the cache
        assert list(tok._plain.encode(text)) == BPE.encode(text, add_special_tokens=False).ids


def test_the_cache_keeps_at_most_its_bounds() -> None:
    def encode(texts: list[str]) -> list[Any]:
        return [BPE.encode(t, add_special_tokens=False) for t in texts]
    encoder = SegmentEncoder(encode, {"<s>": BPE.token_to_id("<s>")}, max_tokens=8,
                             max_entries=2)
    for text in ("the<s>fox", "quick<s>lazy", "dog"):
        assert list(encoder.encode(text)) == BPE.encode(text, add_special_tokens=False).ids
    assert len(encoder) == 2  # the two most recent segments


def test_a_first_section_metaspace_turns_the_cache_off() -> None:
    tok = word_tokenizer()
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace(prepend_scheme="first")
    assert not segments_independent(tok)
    counter = PromptTokenizer(tok)
    assert not counter.segment_cache
    text = "hello<s>world"
    assert list(counter._plain.encode(text)) == tok.encode(text, add_special_tokens=False).ids
