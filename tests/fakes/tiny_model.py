"""A tiny model folder for exact-token tests: a word-level ``tokenizer.json`` (one token per
whitespace-separated word of :data:`WORDS`, else ``[UNK]``; the special tokens of
:data:`SPECIALS`), a ``tokenizer_config.json`` and a ChatML chat template, built in memory by the
``tokenizers`` package (import this module only where it is installed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tokenizers

WORDS = ["[UNK]", "system", "user", "assistant", "you", "are", "terse", "hello", "world", "tool"]
SPECIALS = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"]  # ids 10, 11, 12, 13
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""SmolLM2's chat template without its default system turn: a chat of n messages costs the
words of its contents plus 3 tokens a message (``<|im_start|>``, the role, ``<|im_end|>``) plus
2 (``<|im_start|>assistant``)."""
CONFIG: dict[str, Any] = {"bos_token": "<s>", "eos_token": {"content": "</s>", "special": True},
                          "add_bos_token": True, "chat_template": CHATML}
"""A BOS before every completions prompt; chat gets only the template's special tokens."""


def word_tokenizer() -> Any:
    vocab = {w: i for i, w in enumerate(WORDS)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(SPECIALS)
    return tok


def model_folder(path: Path, config: dict[str, Any] | None = None,
                 template_file: str | None = None) -> Path:
    """Write the model folder at ``path`` (``config``: the ``tokenizer_config.json``, default
    :data:`CONFIG`; ``template_file``: a ``chat_template.jinja`` to write too)."""
    path.mkdir(parents=True, exist_ok=True)
    word_tokenizer().save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(CONFIG if config is None else config))
    if template_file is not None:
        (path / "chat_template.jinja").write_text(template_file)
    return path
