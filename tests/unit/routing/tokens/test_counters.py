from __future__ import annotations

import sys
from pathlib import Path

import pytest

from routing.features import FeatureConfig, FeatureExtractor, RequestInfo
from routing.tokens.counters import (
    CHARS_PER_TOKEN,
    CharEstimate,
    HFTokenizerCounter,
    TokenCounter,
    estimate_tokens,
    tokenizers_available,
)


@pytest.mark.parametrize(
    ("text", "chars_per_token", "expected"),
    [("", 4.0, 0), ("abc", 4.0, 1), ("abcd", 4.0, 1), ("abcde", 4.0, 2), ("x" * 4000, 4.0, 1000),
     ("abcde", 2.0, 3), ("abcdef", 1.5, 4)],
)
def test_char_estimate_is_ceil_of_chars_over_chars_per_token(
    text: str, chars_per_token: float, expected: int
) -> None:
    counter: TokenCounter = CharEstimate(chars_per_token)
    assert counter.count(text) == expected


def test_the_estimate_rounds_characters_up_to_whole_tokens() -> None:
    assert CHARS_PER_TOKEN == 4.0
    assert [estimate_tokens(n) for n in (0, 1, 4, 5, 8, 9, 48, 49)] == [0, 1, 1, 2, 2, 3, 12, 13]
    assert estimate_tokens(10, 2.5) == 4 and estimate_tokens(11, 2.5) == 5
    assert CharEstimate().count("x" * 49) == estimate_tokens(49) == 13  # the same estimate


def test_char_estimate_refuses_a_non_positive_ratio() -> None:
    with pytest.raises(ValueError):
        CharEstimate(0.0)


def test_without_the_tokenizers_package_loading_raises_import_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # as if it were not installed
    with pytest.raises(ImportError):
        HFTokenizerCounter.from_file(tmp_path / "tokenizer.json")


def _word_level_tokenizer_json(path: Path) -> Path:
    """A real tokenizer.json: word-level over a four-word vocabulary, split on whitespace."""
    import tokenizers
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "again": 3}
    tokenizer = tokenizers.Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    target = path / "tokenizer.json"
    tokenizer.save(str(target))
    return target


needs_tokenizers = pytest.mark.skipif(not tokenizers_available(),
                                      reason="the optional 'tokenizers' package is not installed")


@needs_tokenizers
@pytest.mark.parametrize(("text", "expected"), [("", 0), ("hello", 1),
                                                ("hello world again hello", 4),
                                                ("hello unknownword", 2)])
def test_hf_tokenizer_counts_exactly(tmp_path: Path, text: str, expected: int) -> None:
    counter = HFTokenizerCounter.from_file(_word_level_tokenizer_json(tmp_path))
    assert counter.count(text) == expected


@needs_tokenizers
def test_the_extractor_counts_with_a_configured_tokenizer(tmp_path: Path) -> None:
    counter = HFTokenizerCounter.from_file(_word_level_tokenizer_json(tmp_path))
    extractor = FeatureExtractor(FeatureConfig(), {"m": counter})
    got = extractor.extract({"prompt": "hello world " * 30}, RequestInfo("completions", "m", 5))
    assert got.prompt_tokens == 60  # CharEstimate would say ceil(360 / 4) = 90
