"""Request features: what the router measures of one request before choosing where it goes.

Once per request (:func:`extract_features`, :class:`FeatureExtractor`): (1) the canonical
prompt, one deterministic text for the whole request, so that requests sharing a system
prompt, tools and history share a text prefix (:func:`canonical_prompt`); (2) chained XXH3-64
hashes of its full blocks, seeded by the model name: hash i stands for blocks 0..i and is the
same in every gateway process (:func:`block_hashes`; over token ids :func:`token_block_hashes`);
(3) the block size: 16 tokens (vLLM's default KV block) × 4 characters by default
(:class:`FeatureConfig`); (4) prompt tokens: the model's exact prompt ids when it has them,
else its token counter over the canonical text (tokens per block: :func:`tokens_per_block`);
(5) expected output tokens: ``max_tokens``, else the learned mean, else a default; (6) the
session key, a digest of the gateway's session hint or the request's ``user``.

Units: tokens, characters, blocks. Pure CPU work, synchronous; the extractor owns no router
state (the learned output mean is passed in).

See docs/routing.md#request-features.
"""

from __future__ import annotations

import json
import struct
import sys
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from xxhash import xxh3_64_intdigest as _xxh3

from routing.native_value import NativeValue
from routing.tokens.counters import CHARS_PER_TOKEN, CharEstimate, PromptIds, TokenCounter

DEFAULT_BLOCK_TOKENS = 16  # tokens per block: vLLM's default KV block size
DEFAULT_OUTPUT_TOKENS = 256  # tokens expected out when nothing better is known

_STX, _ETX, _US, _SUB, _NUL = "\x02", "\x03", "\x1f", "\x1a", "\x00"


class RequestFeatures(NativeValue):
    """One request as the router sees it.

    ``block_hashes`` are chained hashes of the canonical prompt text cut into fixed-size
    blocks: hash i covers blocks 0..i, so equal hashes mean equal prefixes. Token counts are
    exact with the model's tokenizer and chat template, else estimates (see
    :mod:`routing.features`). ``expected_output_tokens`` is ``max_tokens`` when
    given, else the learned mean for the model, else a default.
    """

    FIELDS = ("model", "block_hashes", "block_tokens", "prompt_tokens", "expected_output_tokens",
              "max_tokens", "session", "stream")
    __slots__ = FIELDS

    def __init__(self, model: str, block_hashes: tuple[int, ...], block_tokens: int,
                 prompt_tokens: int, expected_output_tokens: int, max_tokens: int | None,
                 session: str | None, stream: bool) -> None:
        self.model: Final = model
        self.block_hashes: Final = block_hashes
        self.block_tokens: Final = block_tokens
        self.prompt_tokens: Final = prompt_tokens
        self.expected_output_tokens: Final = expected_output_tokens
        self.max_tokens: Final = max_tokens
        self.session: Final = session
        self.stream: Final = stream

    def matched_tokens(self, blocks: int) -> int:
        """Prompt tokens covered by ``blocks`` leading blocks (tokens), at most the prompt."""
        return min(self.prompt_tokens, max(0, blocks) * self.block_tokens)


@dataclass(frozen=True, slots=True)
class FeatureConfig:
    """``block_tokens``: tokens per hashed block; ``chars_per_token``: characters per token
    used to turn it into ``block_chars``; ``default_output_tokens``: the expected output when
    neither ``max_tokens`` nor a learned mean is known (tokens)."""

    block_tokens: int = DEFAULT_BLOCK_TOKENS
    chars_per_token: float = CHARS_PER_TOKEN
    default_output_tokens: int = DEFAULT_OUTPUT_TOKENS
    block_chars: int = field(init=False, repr=False, compare=False)
    """Characters per block (block_tokens × chars_per_token)."""

    def __post_init__(self) -> None:
        if self.block_tokens < 1 or self.chars_per_token <= 0 or self.default_output_tokens < 1:
            raise ValueError("block_tokens, chars_per_token, default_output_tokens must be > 0")
        object.__setattr__(self, "block_chars",
                           max(1, round(self.block_tokens * self.chars_per_token)))


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str)


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def part_digest(part: Any) -> str:
    """A stable 64-bit hex digest of a structured part (its sorted-key JSON)."""
    return f"{_xxh3(_utf8(_dumps(part))):016x}"


def _render_part(part: Any) -> str:
    if (type(part) is dict or isinstance(part, Mapping)) and part.get("type") == "text":
        text = part.get("text")
        return text if isinstance(text, str) else _dumps(text)
    return _SUB + part_digest(part)


def _render_content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(_render_part(p) for p in content)
    return _dumps(content)


_ROLE_CONTENT = frozenset({"role", "content"})


def _render_message(message: Any) -> str:
    # a parsed body's messages are dicts: tested first (isinstance against an ABC runs Python)
    if type(message) is not dict and not isinstance(message, Mapping):
        return _STX + _dumps(message) + _ETX
    role = message.get("role")
    tail = ""
    if not message.keys() <= _ROLE_CONTENT:  # extra fields: rendered after the content
        tail = _US + _dumps({k: v for k, v in message.items() if k not in _ROLE_CONTENT})
    content = _render_content(message.get("content"))
    return f"{_STX}{role if isinstance(role, str) else _dumps(role)}{_US}{content}{tail}{_ETX}"


def _chat_parts(payload: dict[str, Any]) -> list[str]:
    parts: list[str] = []
    for key in ("tools", "functions"):
        if payload.get(key):
            parts.append(f"{_STX}{key}{_US}{_dumps(payload[key])}{_ETX}")
    messages = payload.get("messages")
    if isinstance(messages, list):
        parts.extend(_render_message(m) for m in messages)
    return parts


def _render_chat(payload: dict[str, Any]) -> str:
    return "".join(_chat_parts(payload))


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in value)


def _render_ids(ids: Sequence[int]) -> str:
    return "ids:" + " ".join(map(str, ids))


def _render_completions(payload: dict[str, Any]) -> str:
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if prompt is None:
        return ""
    if _is_ids(prompt) and prompt:
        return _render_ids(prompt)
    if isinstance(prompt, list) and all(isinstance(p, str) or _is_ids(p) for p in prompt):
        return _NUL.join(p if isinstance(p, str) else _render_ids(p) for p in prompt)
    return _dumps(prompt)


_RESPONSES_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_RESPONSES_ITEM_META = frozenset({"role", "content", "type", "id", "status"})


def _render_responses_part(part: Any) -> str:
    if isinstance(part, Mapping) and part.get("type") in _RESPONSES_TEXT_PARTS:
        text = part.get("text")
        return text if isinstance(text, str) else _dumps(text)
    return _SUB + part_digest(part)


def _render_item(item: Any) -> str:
    """One item of a Responses ``input`` list (docs/routing.md#request-features, step 1)."""
    if not isinstance(item, Mapping):
        return _STX + _dumps(item) + _ETX
    role = item.get("role")
    if not isinstance(role, str):
        rest = {k: v for k, v in item.items() if k != "type"}
        return f"{_STX}{_dumps(item.get('type'))}{_US}{_dumps(rest)}{_ETX}"
    content = item.get("content")
    text = ("".join(_render_responses_part(p) for p in content) if isinstance(content, list)
            else _render_content(content))
    extra = {k: v for k, v in item.items() if k not in _RESPONSES_ITEM_META}
    tail = _US + _dumps(extra) if extra else ""
    return f"{_STX}{role}{_US}{text}{tail}{_ETX}"


def _responses_parts(payload: dict[str, Any]) -> list[str]:
    parts: list[str] = []
    if payload.get("tools"):
        parts.append(f"{_STX}tools{_US}{_dumps(payload['tools'])}{_ETX}")
    instructions = payload.get("instructions")
    if isinstance(instructions, str) and instructions:
        parts.append(f"{_STX}system{_US}{instructions}{_ETX}")
    items = payload.get("input")
    if isinstance(items, str):
        parts.append(f"{_STX}user{_US}{items}{_ETX}")
    elif isinstance(items, list):
        parts.extend(_render_item(item) for item in items)
    return parts


def _render_responses(payload: dict[str, Any]) -> str:
    return "".join(_responses_parts(payload))


_RENDERERS: Mapping[str, Callable[[dict[str, Any]], str]] = MappingProxyType(
    {"chat": _render_chat, "completions": _render_completions,
     "responses": _render_responses})


def canonical_prompt(payload: dict[str, Any], kind: str) -> str:
    """The request's whole prompt as one deterministic text; ``kind``: chat | completions |
    responses."""
    try:
        render = _RENDERERS[kind]
    except KeyError:
        raise ValueError(f"unknown request kind {kind!r}; expected one of "
                         f"{sorted(_RENDERERS)}") from None
    return render(payload)


def canonical_lead(payload: dict[str, Any], kind: str) -> tuple[str, int]:
    """:func:`canonical_prompt` and the length of its leading segment [characters]: for a
    chat or a Responses request of several parts, the first (the tools, else the first
    message or the instructions — what requests share most); else 0."""
    if kind == "chat":
        parts = _chat_parts(payload)
    elif kind == "responses":
        parts = _responses_parts(payload)
    else:
        return canonical_prompt(payload, kind), 0
    return "".join(parts), len(parts[0]) if len(parts) > 1 else 0


def block_hashes(text: str, block_chars: int, seed: str = "") -> tuple[int, ...]:
    """Chained 64-bit hashes of the full ``block_chars``-character blocks of ``text``.

    ``h_i = XXH3-64(utf8(block_i), seed=h_{i-1})``, ``h_{-1}`` = XXH3-64 of ``seed`` (0 when it
    is empty). A trailing partial block is not hashed. ASCII text (one byte a character) is
    encoded once and cut into byte blocks; other text is cut into characters, then encoded.
    """
    if block_chars < 1:
        raise ValueError("block_chars must be >= 1")
    return _chain(text, 0, block_chars, _xxh3(_utf8(seed)) if seed else 0)


def _little_endian(ids: Sequence[int]) -> bytes:
    """``ids`` as 4-byte unsigned little-endian integers."""
    data = ids if isinstance(ids, array) and ids.typecode == "I" else array("I", ids)
    if sys.byteorder == "big":
        data = array("I", data)
        data.byteswap()
    return data.tobytes()


def token_block_hashes(ids: Sequence[int], block_tokens: int,
                       seed: str = "") -> tuple[int, ...]:
    """Chained 64-bit hashes of the full ``block_tokens``-token blocks of ``ids``:
    ``h_i = XXH3-64(block_i as 4-byte little-endian ids, seed=h_{i-1})``, ``h_{-1}`` as in
    :func:`block_hashes`. A trailing partial block is not hashed."""
    return chain_token_hashes(ids, block_tokens, chain_start(seed))


def chain_start(seed: str) -> int:
    """``h_{-1}`` of a chain: XXH3-64 of ``seed``, 0 when it is empty."""
    return _xxh3(_utf8(seed)) if seed else 0


def chain_token_hashes(ids: Sequence[int], block_tokens: int, h: int) -> tuple[int, ...]:
    """The chained hashes of the full ``block_tokens``-token blocks of ``ids``, chained from
    ``h`` (the hash of the block before them, or :func:`chain_start`)."""
    if block_tokens < 1:
        raise ValueError("block_tokens must be >= 1")
    return _chain_bytes(_little_endian(ids), 0, 4 * block_tokens, h)


def _chain(text: str, start: int, block_chars: int, h: int) -> tuple[int, ...]:
    """The chained hashes of the full blocks of ``text`` from character ``start`` (a block
    boundary) on, chained from ``h``, the hash before them."""
    if text.isascii():
        return _chain_bytes(text.encode("ascii"), start, block_chars, h)
    ends = range(start + block_chars, len(text) + 1, block_chars)
    return tuple([(h := _xxh3(_utf8(text[end - block_chars:end]), h)) for end in ends])


def _chain_bytes(data: bytes, start: int, block_bytes: int, h: int) -> tuple[int, ...]:
    """The chained hashes of the full ``block_bytes``-byte blocks of ``data`` (an ASCII text's
    encoding, one byte a character, or token ids) from byte ``start`` on, chained from ``h``.
    The blocks are cut in one C call (:func:`struct.unpack_from`, a format of one ``Ns`` field
    a block), cheaper than a slice each."""
    blocks = (len(data) - start) // block_bytes
    cut = struct.unpack_from(f"{block_bytes}s" * blocks, data, start)
    return tuple([(h := _xxh3(block, h)) for block in cut])


Lead = tuple[str, tuple[int, ...]]
"""A cached lead: its text and its block hashes."""


class LeadCache:
    """The block hashes of recent prompts' leading segments (:func:`canonical_lead`): many
    requests open with the same tools or system prompt, whose blocks need hashing once.

    ``hashes(text, lead, block_chars, seed)`` equals ``block_hashes(text, block_chars, seed)``:
    the full blocks inside the first ``lead`` characters come from the cache, the rest are
    chained on from the last of them. An entry is keyed by the seed, the block size, the
    length of those blocks [characters] and the XXH3-64 digest of their UTF-8 text (cheaper to
    compute than the string's own hash), and found only when its text is the prompt's
    beginning (a digest collision reads as a miss, whose entry replaces the other). Bounded:
    at most ``max_entries`` leads and ``max_chars`` characters of them, least recently used
    dropped first; a lead shorter than ``min_blocks`` blocks is not cached. Instance state
    only.
    """

    __slots__ = ("_max_entries", "_max_chars", "_min_blocks", "_map", "_chars")

    def __init__(self, max_entries: int = 256, max_chars: int = 4_000_000,
                 min_blocks: int = 4) -> None:
        self._max_entries, self._max_chars = max_entries, max_chars
        self._min_blocks = min_blocks
        self._map: dict[tuple[str, int, int, int], Lead] = {}
        self._chars = 0

    def __len__(self) -> int:
        return len(self._map)

    def hashes(self, text: str, lead: int, block_chars: int, seed: str) -> tuple[int, ...]:
        cut = lead // block_chars * block_chars
        if cut < self._min_blocks * block_chars or cut > self._max_chars:
            return block_hashes(text, block_chars, seed)
        data = text.encode("ascii") if text.isascii() else None
        key = (seed, block_chars, cut,
               _xxh3(data[:cut] if data is not None else _utf8(text[:cut])))
        held = self._map.pop(key, None)
        if held is None or not text.startswith(held[0]):
            held = self._learn(text[:cut], block_chars, seed, held is None)
        self._map[key] = held  # the most recently used, last
        head = held[1]
        if data is None:
            return head + _chain(text, cut, block_chars, head[-1])
        return head + _chain_bytes(data, cut, block_chars, head[-1])

    def _learn(self, lead: str, block_chars: int, seed: str, new: bool) -> Lead:
        """The entry of ``lead``: counted and room made for it when ``new`` (not replacing a
        colliding one of the same length)."""
        if new:
            self._chars += len(lead)
            self._trim()
        return lead, block_hashes(lead, block_chars, seed)

    def _trim(self) -> None:
        while self._map and (len(self._map) >= self._max_entries
                             or self._chars > self._max_chars):
            oldest = next(iter(self._map))
            del self._map[oldest]
            self._chars -= oldest[2]


def token_id_count(payload: dict[str, Any], kind: str) -> int | None:
    """The exact prompt length of a completions request given as token ids, else None."""
    prompt = payload.get("prompt") if kind == "completions" else None
    if _is_ids(prompt) and prompt:
        return len(prompt)
    if isinstance(prompt, list) and prompt and all(_is_ids(p) for p in prompt):
        return sum(len(p) for p in prompt)
    return None


def _positive_int(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return value if ok else None


def resolve_max_tokens(payload: dict[str, Any], max_tokens: int | None) -> int | None:
    """``max_tokens`` as given, else the payload's ``max_completion_tokens`` or
    ``max_tokens`` (positive integers only)."""
    if max_tokens is not None:
        return max_tokens
    return (_positive_int(payload.get("max_completion_tokens"))
            or _positive_int(payload.get("max_tokens")))


def expected_output(max_tokens: int | None, learned: float | None, default: int) -> int:
    """Output tokens to expect: ``max_tokens``, else the learned mean, else ``default``."""
    if max_tokens is not None:
        return max_tokens
    if learned is not None and learned > 0:
        return max(1, round(learned))
    return default


def session_key(payload: dict[str, Any], session_hint: str | None) -> str | None:
    """The digest of the gateway's session hint when non-empty, else of the request's
    ``user``, else None."""
    key = session_hint or payload.get("user")
    return f"{_xxh3(_utf8(key)):016x}" if isinstance(key, str) and key else None


def tokens_per_block(config: FeatureConfig, prompt_chars: int, prompt_tokens: int) -> int:
    """Tokens in one block of this prompt (step 4 of the module docstring): ``block_chars`` ×
    prompt tokens ÷ prompt characters, rounded, once the prompt holds a full block, else
    ``block_tokens``."""
    if prompt_chars < config.block_chars or prompt_tokens <= 0:
        return config.block_tokens
    return max(1, round(config.block_chars * prompt_tokens / prompt_chars))


class RequestInfo(NativeValue):
    """The fields of one request the extractor reads besides its payload."""

    FIELDS = ("kind", "model", "max_tokens", "stream", "session_hint", "learned_output_tokens")
    __slots__ = FIELDS

    def __init__(self, kind: str, model: str, max_tokens: int | None = None,
                 stream: bool = False, session_hint: str | None = None,
                 learned_output_tokens: float | None = None) -> None:
        self.kind: Final = kind
        self.model: Final = model
        self.max_tokens: Final = max_tokens
        self.stream: Final = stream
        self.session_hint: Final = session_hint
        self.learned_output_tokens: Final = learned_output_tokens


Hasher = Callable[[str, int, int, str], tuple[int, ...]]
"""(text, lead characters, block characters, seed) → the text's chained block hashes."""


def _hash_whole(text: str, lead: int, block_chars: int, seed: str) -> tuple[int, ...]:
    return block_hashes(text, block_chars, seed)


def _prompt_blocks(payload: dict[str, Any], info: RequestInfo, config: FeatureConfig,
                   counter: TokenCounter, hasher: Hasher,
                   exact: PromptIds | None) -> tuple[tuple[int, ...], int, int]:
    """(block hashes, tokens per block, prompt tokens) of the request (module docstring,
    steps 2-4)."""
    ids = exact.prompt_ids(payload, info.kind) if exact is not None else None
    if ids is not None:
        blocks = token_block_hashes(ids, config.block_tokens, info.model)
        return blocks, config.block_tokens, len(ids)
    text, lead = canonical_lead(payload, info.kind)
    given = token_id_count(payload, info.kind) if info.kind == "completions" else None
    prompt_tokens = given if given is not None else counter.count(text)
    return (hasher(text, lead, config.block_chars, info.model),
            tokens_per_block(config, len(text), prompt_tokens), prompt_tokens)


def extract_features(payload: dict[str, Any], info: RequestInfo, config: FeatureConfig,
                     counter: TokenCounter, hasher: Hasher = _hash_whole,
                     exact: PromptIds | None = None) -> RequestFeatures:
    """The features of one request (sync; docs/routing.md#request-features). ``hasher``: how
    the block hashes of the canonical text are computed (a :meth:`LeadCache.hashes` gives the
    same values sooner); ``exact``: the model's exact prompt ids, if it has them."""
    hashes, block_tokens, prompt_tokens = _prompt_blocks(payload, info, config, counter,
                                                         hasher, exact)
    max_tokens = resolve_max_tokens(payload, info.max_tokens)
    return RequestFeatures(
        model=info.model,
        block_hashes=hashes,
        block_tokens=block_tokens,
        prompt_tokens=prompt_tokens,
        expected_output_tokens=expected_output(
            max_tokens, info.learned_output_tokens, config.default_output_tokens),
        max_tokens=max_tokens,
        session=session_key(payload, info.session_hint),
        stream=info.stream,
    )


class FeatureExtractor:
    """Turns a request into :class:`RequestFeatures`: pure CPU work (a configured tokenizer
    included), synchronous so that it costs no task switch on the hot path.

    ``counters``: a token counter per model name; models without one use ``default`` (the
    character estimate of ``config.chars_per_token`` unless given); ``exact``: exact prompt
    ids per model name (its tokenizer and chat template), tried first."""

    __slots__ = ("_config", "_counters", "_default", "_leads", "_exact")

    def __init__(self, config: FeatureConfig | None = None,
                 counters: Mapping[str, TokenCounter] | None = None,
                 default: TokenCounter | None = None,
                 exact: Mapping[str, PromptIds] | None = None) -> None:
        self._config = config or FeatureConfig()
        self._counters: dict[str, TokenCounter] = dict(counters or {})
        self._default: TokenCounter = default or CharEstimate(self._config.chars_per_token)
        self._leads = LeadCache()
        self._exact: dict[str, PromptIds] = dict(exact or {})

    @property
    def config(self) -> FeatureConfig:
        return self._config

    def counter_for(self, model: str) -> TokenCounter:
        """The token counter of ``model``."""
        return self._counters.get(model, self._default)

    def extract(self, payload: dict[str, Any], info: RequestInfo) -> RequestFeatures:
        """Features of one request (``info.learned_output_tokens``: the router state's mean
        output length for the model, if known)."""
        return extract_features(payload, info, self._config, self.counter_for(info.model),
                                self._leads.hashes, self._exact.get(info.model))
