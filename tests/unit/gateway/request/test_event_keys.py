"""gateway.request.event_keys: the token-event and usage keys of a streamed region, the C
implementation held to the Python reference on every case and on random regions."""

from __future__ import annotations

import importlib.util
import random
from types import ModuleType

import pytest

from gateway import native
from gateway.request import event_keys

MODULE = "gateway.request.event_keys"


def _reference() -> ModuleType:
    """event_keys.py itself, whatever the import system gives for the module's name."""
    spec = importlib.util.spec_from_file_location("event_keys_reference",
                                                  native.source_of(MODULE))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REFERENCE = _reference()
IMPLEMENTATIONS = [pytest.param(REFERENCE, id="python"),
                   pytest.param(event_keys, id="imported")]


@pytest.mark.parametrize("keys", IMPLEMENTATIONS)
@pytest.mark.parametrize(("region", "chat", "text"), [
    (b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n', 1, 0),
    (b'data: {"choices":[{"delta":{"content":""}}]}\n\n', 0, 0),
    (b'data: {"choices":[{"delta":{"reasoning_content":"r"}}]}\n\n', 1, 0),
    (b'data: {"choices":[{"delta":{"_reasoning_content":"r"}}]}\n\n', 0, 0),
    (b'data: {"choices":[{"delta":{"tool_calls": [ {"index":0}]}}]}\n\n', 1, 0),
    (b'data: {"choices":[{"delta":{"tool_calls": [ ]}}]}\n\n', 0, 0),
    (b'data: {"choices":[{"text":"once"},{"text" : "twice"},{"text":""}]}\n\n', 0, 2),
    (b'{"content":"', 1, 0),  # a region may end inside the value it opens
    (b'{"content":', 0, 0),
    (b'content":"a"', 0, 0),  # no opening quote before the region's start
    (b'content"content":"x"', 1, 0),
    (b'"text"text":"x"', 0, 0),  # overlapping keys: the second starts inside the first
    (b'"tool_calls"tool_calls":[1]', 0, 0),
    (b'{"role":"text"}', 0, 0),  # a value, not a key
    (b"", 0, 0),
])
def test_token_keys(keys: ModuleType, region: bytes, chat: int, text: int) -> None:
    assert (keys.chat_tokens(region), keys.text_tokens(region)) == (chat, text)


@pytest.mark.parametrize("keys", IMPLEMENTATIONS)
def test_the_usage_key(keys: ModuleType) -> None:
    assert keys.holds_usage(b'{"choices":[],"usage":{"completion_tokens":3}}')
    assert not keys.holds_usage(b'{"choices":[],"usage_":1,"usage :2}')
    assert not keys.holds_usage(b"")


@pytest.mark.parametrize("keys", IMPLEMENTATIONS)
def test_a_region_must_be_bytes(keys: ModuleType) -> None:
    with pytest.raises(TypeError):
        keys.chat_tokens("content")


PIECES = [b'"content"', b'content"', b'"reasoning_', b'"reasoning_content"', b'"tool_calls"',
          b'"text"', b'"usage"', b'"', b":", b" ", b"\n", b"\r", b"\t", b"[", b"]", b"{", b"}",
          b"x", b",", b'""', b"\\", b"data: "]


def test_the_c_module_counts_as_the_reference_on_random_regions() -> None:
    """Regions made of the keys' pieces in random order: the byte patterns where an off-by-one
    would show (keys at either end, back to back, overlapping, white space runs)."""
    if (event_keys.__file__ or "").endswith(".py"):
        pytest.skip("the C module is not built (make native), or the sources are preferred")
    rng = random.Random(7)
    for _ in range(20000):
        region = b"".join(rng.choice(PIECES) for _ in range(rng.randint(0, 14)))
        expected = (REFERENCE.chat_tokens(region), REFERENCE.text_tokens(region),
                    REFERENCE.holds_usage(region))
        assert (event_keys.chat_tokens(region), event_keys.text_tokens(region),
                event_keys.holds_usage(region)) == expected, region
