"""Exact prompt tokens: the token ids the engine prefills for a request, from the model's files.

A model's tokenizer (``tokenizer.json``, through the ``tokenizers`` package) and its chat
template (:mod:`routing.tokens.chat_template`) give, per request, the ids the engine computes,
so that their count equals the engine's ``usage.prompt_tokens``: a chat request's rendered
template without added special tokens, a completions prompt with them (vLLM's defaults), a
Responses request's instructions and messages rendered as chat. Anything else gives None: the
caller falls back to its estimate.

Loading (:func:`load_prompt_tokenizer`) reads ``tokenizer.json``, ``tokenizer_config.json``
(special tokens; ``add_bos_token`` / ``add_eos_token``: :func:`set_post_processor`) and the chat
templates (:func:`template_sources`: an explicit file, else the folder's ``.jinja`` files, else
the config's). The hot path goes through :class:`SegmentEncoder`, which encodes the segments
between special tokens once each (a bounded LRU; off when segments are not independent).

See docs/routing.md#exact-prompt-tokens.
"""

from __future__ import annotations

import importlib
import json
import re
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from routing.tokens.chat_template import SPECIAL_TOKEN_NAMES, ChatTemplate

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
TEMPLATES_DIR = "additional_chat_templates"
DEFAULT_TEMPLATE, TOOL_TEMPLATE = "default", "tool_use"
RESPONSES_ROLES = frozenset({"user", "system", "developer"})
MAX_CACHED_TOKENS = 2_000_000  # ids the segment cache keeps (8 MB)
MAX_CACHED_SEGMENTS = 65_536

Encodings = Callable[[list[str]], Sequence[Any]]


def _ids(values: Iterable[int]) -> array[int]:
    return array("I", values)


class SegmentEncoder:
    """A text's token ids (no special tokens added), segment by segment through a bounded
    cache (docs/routing.md#exact-prompt-tokens). ``specials``: special token text → id, or None when
    segments are not independent (no cache, the whole text encoded each time)."""

    __slots__ = ("_encode", "_pattern", "_specials", "_cache", "_tokens", "_max_tokens",
                 "_max_entries")

    def __init__(self, encode: Encodings, specials: Mapping[str, int] | None,
                 max_tokens: int = MAX_CACHED_TOKENS,
                 max_entries: int = MAX_CACHED_SEGMENTS) -> None:
        self._encode = encode
        self._specials = MappingProxyType(dict(specials or {}))
        self._pattern = _special_pattern(self._specials) if specials is not None else None
        self._cache: dict[str, array[int]] | None = {} if specials is not None else None
        self._tokens, self._max_tokens, self._max_entries = 0, max_tokens, max_entries

    @property
    def cached(self) -> bool:
        """Whether segments are cached."""
        return self._cache is not None

    def __len__(self) -> int:
        return len(self._cache or ())

    def encode(self, text: str) -> array[int]:
        cache = self._cache
        if cache is None:
            return _ids(self._encode([text])[0].ids)
        pieces = self._pattern.split(text) if self._pattern is not None else [text]
        fresh = list(dict.fromkeys(p for p in pieces[::2] if p and p not in cache))
        new = {p: _ids(e.ids) for p, e in zip(fresh, self._encode(fresh), strict=True)} \
            if fresh else {}
        out: array[int] = array("I")
        for i, piece in enumerate(pieces):
            if i & 1:
                out.append(self._specials[piece])
            elif piece:
                out.extend(new[piece] if piece in new else self._recall(piece))
        for piece, ids in new.items():
            self._keep(piece, ids)
        return out

    def _recall(self, piece: str) -> array[int]:
        assert self._cache is not None
        ids = self._cache.pop(piece)
        self._cache[piece] = ids  # the most recently used, last
        return ids

    def _keep(self, piece: str, ids: array[int]) -> None:
        assert self._cache is not None
        if len(ids) > self._max_tokens:
            return
        self._cache[piece] = ids
        self._tokens += len(ids)
        while self._tokens > self._max_tokens or len(self._cache) > self._max_entries:
            self._tokens -= len(self._cache.pop(next(iter(self._cache))))


def _special_pattern(specials: Mapping[str, int]) -> re.Pattern[str] | None:
    """One capturing alternation of the special tokens, longest first (leftmost-longest
    matching, as the tokenizer's own)."""
    if not specials:
        return None
    return re.compile("(" + "|".join(map(re.escape, sorted(specials, key=len, reverse=True)))
                      + ")")


# -- the tokenizer's parts -------------------------------------------------------------------

def verbatim_specials(tokenizer: Any) -> dict[str, int]:
    """Special added tokens matched verbatim in any text: text → id."""
    return {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items()
            if t.special and not (t.normalized or t.lstrip or t.rstrip or t.single_word)}


def _walk(node: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(node, Mapping):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def segments_independent(tokenizer: Any) -> bool:
    """Whether the text between special tokens encodes the same alone (see the module
    docstring): no first-section-only Metaspace, special tokens split out of text."""
    if getattr(tokenizer, "encode_special_tokens", False):
        return False
    spec = json.loads(tokenizer.to_str())
    return not any(n.get("type") == "Metaspace" and n.get("prepend_scheme") == "first"
                   for n in _walk(spec.get("pre_tokenizer")))


def _probe(specials: Mapping[str, int]) -> str:
    marks = sorted(specials)[:2] or [""]
    open_, close = marks[0], marks[-1]
    return (f"{open_}system\nYou are terse.{close}\n{open_}user\n Hello,  world! 12 "
            f"ünïcode\t{close}\n{open_}assistant\n")


def _encoder(tokenizer: Any, encode: Encodings) -> SegmentEncoder:
    specials = verbatim_specials(tokenizer)
    if not segments_independent(tokenizer):
        return SegmentEncoder(encode, None)
    encoder = SegmentEncoder(encode, specials)
    probe = _probe(specials)
    if list(encoder.encode(probe)) != encode([probe])[0].ids:
        return SegmentEncoder(encode, None)
    return encoder


def _batch_encoder(tokenizer: Any, special: bool) -> Encodings:
    """Encode a batch without offsets when the library can (``encode_batch_fast``)."""
    batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    return lambda texts: batch(texts, add_special_tokens=special)


def _wrapping(tokenizer: Any) -> tuple[array[int], array[int]] | None:
    """The ids the post-processor puts before and after a single text, or None when it does
    more than wrap it."""
    probe = "Hello world"
    bare = tokenizer.encode(probe, add_special_tokens=False).ids
    full = tokenizer.encode(probe, add_special_tokens=True).ids
    for k in range(len(full) - len(bare) + 1):
        if full[k:k + len(bare)] == bare:
            return _ids(full[:k]), _ids(full[k + len(bare):])
    return None


# -- per request -----------------------------------------------------------------------------

def responses_as_chat(payload: Mapping[str, Any]) -> dict[str, Any] | None:
    """A Responses request as the chat request the engine renders, or None (module
    docstring)."""
    if payload.get("tools") or payload.get("previous_response_id"):
        return None
    messages: list[Any] = []
    if isinstance(payload.get("instructions"), str) and payload["instructions"]:
        messages.append({"role": "system", "content": payload["instructions"]})
    items = payload.get("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif isinstance(items, list) and all(
            isinstance(i, Mapping) and i.get("role") in RESPONSES_ROLES
            and i.get("type", "message") == "message" for i in items):
        messages.extend({"role": i["role"], "content": i.get("content")} for i in items)
    else:
        return None
    return {"messages": messages}


class PromptTokenizer:
    """One model's exact prompt tokens (docs/routing.md#exact-prompt-tokens); also a
    :class:`~routing.tokens.counters.TokenCounter` of plain text (no special tokens added).

    ``templates``: chat templates by name (``default``, ``tool_use``, ...); ``source``: where
    the files came from, for the start-up log."""

    __slots__ = ("source", "_tokenizer", "_plain", "_templates", "_wrap", "_special",
                 "_texts")

    def __init__(self, tokenizer: Any, templates: Mapping[str, ChatTemplate] | None = None,
                 source: str = "") -> None:
        self.source = source
        self._tokenizer = tokenizer
        self._plain = _encoder(tokenizer, _batch_encoder(tokenizer, False))
        self._templates = MappingProxyType(dict(templates or {}))
        self._wrap = _wrapping(tokenizer)
        self._special = _batch_encoder(tokenizer, True)
        self._texts: dict[int, str] = {}

    @property
    def segment_cache(self) -> bool:
        return self._plain.cached

    def template_for(self, tools: Any) -> ChatTemplate | None:
        """The chat template a request uses (``tool_use`` for one with tools, if any)."""
        if tools is not None and TOOL_TEMPLATE in self._templates:
            return self._templates[TOOL_TEMPLATE]
        return self._templates.get(DEFAULT_TEMPLATE) or next(iter(self._templates.values()),
                                                             None)

    def count(self, text: str) -> int:
        """Tokens of ``text`` as is (no special tokens added); text the tokenizer refuses (a
        lone surrogate) is counted with U+FFFD in its place."""
        try:
            return len(self._plain.encode(text))
        except Exception:  # noqa: BLE001 - the library raises its own exception types
            return len(self._plain.encode(text.encode("utf-8", "replace").decode("utf-8")))

    def render_chat(self, payload: Mapping[str, Any]) -> str | None:
        """The chat request's prompt text, or None (no template, or not modelled)."""
        template = self.template_for(payload.get("tools"))
        return template.render(payload) if template is not None else None

    def chat_ids(self, payload: Mapping[str, Any]) -> array[int] | None:
        text = self.render_chat(payload)
        return self._plain.encode(text) if text is not None else None

    def completion_ids(self, prompt: Any) -> array[int] | None:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, list) and prompt and all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in prompt):
            return _ids(prompt)
        if not isinstance(prompt, str):
            return None
        if self._wrap is None:
            return _ids(self._special([prompt])[0].ids)
        head, tail = self._wrap
        return head + self._plain.encode(prompt) + tail

    def prompt_ids(self, payload: Mapping[str, Any], kind: str) -> array[int] | None:
        """The request's prompt token ids as the engine computes them (``kind``: chat |
        completions | responses), or None when not modelled (or the tokenizer refuses its
        text, e.g. a lone surrogate)."""
        try:
            if kind == "chat":
                return self.chat_ids(payload)
            if kind == "completions":
                return self.completion_ids(payload.get("prompt"))
            chat = responses_as_chat(payload) if kind == "responses" else None
            return self.chat_ids(chat) if chat is not None else None
        except Exception:  # noqa: BLE001 - the library raises its own exception types
            return None

    def token_text(self, token_id: int) -> str:
        """One token's text (special tokens included), remembered once decoded."""
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self._tokenizer.decode([token_id],
                                                                  skip_special_tokens=False)
        return text

    def describe(self) -> str:
        """One line for the start-up log: files, template, content format, cache."""
        template = self.template_for(None)
        chat = (f"chat template ({len(self._templates)}), content format "
                f"{template.content_format}" if template is not None
                else "no chat template (chat prompts: the estimate)")
        cache = "segment cache on" if self.segment_cache else "segment cache off"
        return f"exact ({self.source or 'tokenizer'}; {chat}; {cache})"


# -- loading ---------------------------------------------------------------------------------

def _token_text(value: Any) -> str | None:
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def special_tokens(config: Mapping[str, Any]) -> dict[str, str]:
    """The named special tokens of a ``tokenizer_config.json`` (strings or AddedToken
    objects)."""
    return {name: text for name in SPECIAL_TOKEN_NAMES
            if (text := _token_text(config.get(name))) is not None}


def set_post_processor(tokenizer: Any, config: Mapping[str, Any]) -> None:
    """transformers 5's post-processor rule: ``[bos] $A [eos]`` when the config sets
    ``add_bos_token`` / ``add_eos_token`` or the tokenizer has none (a token not in the
    vocabulary is left out)."""
    if "add_bos_token" not in config and "add_eos_token" not in config \
            and tokenizer.post_processor is not None:
        return
    specials = special_tokens(config)
    used = {kind: (text, tokenizer.token_to_id(text)) for kind in ("bos", "eos")
            if config.get(f"add_{kind}_token") and (text := specials.get(f"{kind}_token"))}
    used = {kind: (text, i) for kind, (text, i) in used.items() if i is not None}
    bos, eos = used.get("bos"), used.get("eos")

    def one(seq: str, type_id: int) -> str:
        marks = [f"{bos[0]}:{type_id}"] if bos else []
        return " ".join([*marks, f"${seq}:{type_id}", *([f"{eos[0]}:{type_id}"] if eos else [])])

    processors = importlib.import_module("tokenizers.processors")
    tokenizer.post_processor = processors.TemplateProcessing(
        single=one("A", 0), pair=f"{one('A', 0)} {one('B', 1)}",
        special_tokens=list(dict(used.values()).items()))


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def template_sources(folder: Path, config: Mapping[str, Any],
                     chat_template: str | Path | None = None) -> dict[str, str]:
    """The model's chat templates by name (which files win: docs/routing.md#exact-prompt-tokens)."""
    if chat_template is not None:
        return {DEFAULT_TEMPLATE: Path(chat_template).read_text(encoding="utf-8")}
    named = {p.stem: p.read_text(encoding="utf-8")
             for p in sorted((folder / TEMPLATES_DIR).glob("*.jinja"))}
    if (folder / TEMPLATE_FILE).is_file():
        return {DEFAULT_TEMPLATE: (folder / TEMPLATE_FILE).read_text(encoding="utf-8"), **named}
    if named:
        return named
    given = config.get("chat_template")
    if isinstance(given, str):
        return {DEFAULT_TEMPLATE: given}
    if isinstance(given, list):
        return {t["name"]: t["template"] for t in given
                if isinstance(t, Mapping) and isinstance(t.get("template"), str)}
    return {}


def load_prompt_tokenizer(path: str | Path, chat_template: str | Path | None = None,
                          content_format: str = "auto") -> PromptTokenizer:
    """A model's :class:`PromptTokenizer` from ``path`` (``tokenizer.json`` or the model
    folder; docs/routing.md#exact-prompt-tokens). Raises ImportError without ``tokenizers`` (or
    ``jinja2`` when there is a template), OSError / ValueError for unreadable files."""
    path = Path(path)
    file = path / TOKENIZER_FILE if path.is_dir() else path
    folder = file.parent
    tokenizer = importlib.import_module("tokenizers").Tokenizer.from_file(str(file))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    config = _read_json(folder / CONFIG_FILE)
    set_post_processor(tokenizer, config)
    specials = special_tokens(config)
    templates = {name: ChatTemplate(source, specials, content_format)
                 for name, source in template_sources(folder, config, chat_template).items()}
    where = str(file) + (f", {chat_template}" if chat_template is not None else "")
    return PromptTokenizer(tokenizer, templates, where)
