"""The engine APIs that generate nothing: embeddings, score, rerank, tokenize, detokenize,
render.

Answered at once (no engine time is simulated), deterministically, in vLLM's shapes:
:func:`tokenize` / :func:`detokenize` with the simulator's own 4-character tokens
(:func:`token_id`), so ``count`` is the prompt tokens the engine bills; :func:`rendered`, vLLM's
render API (``/v1/chat/completions/render``, ``/v1/completions/render``): a generation request
validated as the engine would, as the token ids it would prefill; :func:`embeddings`
unit vectors of ``dimensions`` (:data:`EMBEDDING_DIMS`) Gaussian draws seeded by model and
text, as floats or base64; :func:`score` and :func:`rerank` by :func:`relevance`, the share of
the query's words the document holds.

Bad input is vLLM's 400 (:class:`~backends.sim.openai_api.ApiError`).
See docs/simulator.md#pooling-apis.
"""

from __future__ import annotations

import base64
import json
import math
import random
import re
import struct
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from backends.sim import shapes, tokens
from backends.sim.behaviour import JSON, Dialect
from backends.sim.openai_api import ApiError, Generation, ModelInfo, model_of

EMBEDDING_DIMS = 64
"""Dimensions of an embedding when the request sets none."""
MAX_DIMS = 4096
_PACKED = 2**32
_WORD = re.compile(r"[a-z0-9]+")


def token_id(chunk: str) -> int:
    """The id of one 4-character token (module docstring)."""
    try:
        return int.from_bytes(chunk.encode("latin-1"), "big")
    except UnicodeEncodeError:
        return _PACKED + zlib.crc32(chunk.encode("utf-8", "surrogatepass"))


def token_text(token: int) -> str:
    """The text of one token id: its packed characters, padding dropped; else U+FFFD."""
    if 0 <= token < _PACKED:
        return token.to_bytes(4, "big").decode("latin-1").rstrip("\0")
    return "\ufffd"


def tokenize(body: Mapping[str, Any], dialect: Dialect, info: ModelInfo) -> JSON:
    model_of(body, dialect, info)
    messages = body.get("messages")
    if "prompt" not in body and isinstance(messages, list):
        text = tokens.render_chat([m for m in messages if isinstance(m, dict)], body.get("tools"))
    elif isinstance(body.get("prompt"), str):
        text = body["prompt"]
    else:
        raise ApiError(400, "prompt must be a string, or messages a list of messages", "prompt")
    chunks = tokens.stream_tokens(text) if text else []
    return {"count": len(chunks), "max_model_len": info.max_context,
            "tokens": [token_id(c) for c in chunks],
            "token_strs": [c.rstrip("\0") for c in chunks]
            if body.get("return_token_strs") else None}


def rendered(gen: Generation, ids: Sequence[int], rid: str, body: Mapping[str, Any]) -> JSON:
    """vLLM's ``GenerateRequest`` for a validated request ``gen`` whose prompt is ``ids``, as
    its render API answers (``serve/disagg/protocol.py``): ``sampling_params`` holds only the
    fields the simulator honours (``max_tokens`` as the context cut it)."""
    params = {"n": 1, "max_tokens": gen.max_tokens, "min_tokens": gen.min_tokens,
              "ignore_eos": gen.ignore_eos, "seed": gen.seed}
    return {"request_id": rid, "token_ids": list(ids), "features": None,
            "sampling_params": params, "model": body.get("model"), "stream": gen.stream,
            "stream_options": body.get("stream_options") if gen.stream else None,
            "cache_salt": body.get("cache_salt"), "priority": body.get("priority", 0),
            "kv_transfer_params": None}


def detokenize(body: Mapping[str, Any], dialect: Dialect, info: ModelInfo) -> JSON:
    model_of(body, dialect, info)
    ids = body.get("tokens")
    if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        raise ApiError(400, "tokens must be a list of non-negative integers", "tokens")
    return {"prompt": "".join(token_text(t) for t in ids)}


def embedding(model: str, text: str, dims: int) -> list[float]:
    """The unit vector of ``text`` (module docstring)."""
    rng = random.Random(f"{model}\0{text}")
    vector = [rng.gauss(0.0, 1.0) for _ in range(dims)]
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


def embeddings(body: Mapping[str, Any], dialect: Dialect, info: ModelInfo, rid: str,
               created: int) -> JSON:
    model = model_of(body, dialect, info)
    texts = _embedding_inputs(body)
    dims = _dims(body.get("dimensions"))
    as_base64 = _encoding(body.get("encoding_format"))
    data = []
    for i, text in enumerate(texts):
        vector = embedding(model, text, dims)
        value: list[float] | str = (
            base64.b64encode(struct.pack(f"<{dims}f", *vector)).decode("ascii")
            if as_base64 else vector)
        data.append({"index": i, "object": "embedding", "embedding": value})
    prompt = sum(tokens.estimate_tokens(t) for t in texts)
    return {"id": f"embd-{rid}", "object": "list", "created": created, "model": model,
            "data": data, "usage": shapes.usage(dialect, prompt, 0)}


def _embedding_inputs(body: Mapping[str, Any]) -> list[str]:
    """The texts to embed: ``input`` (a string, strings, token ids or lists of them) or a
    chat ``messages`` list rendered with the chat template."""
    messages = body.get("messages")
    if "input" not in body and isinstance(messages, list) and messages:
        return [tokens.render_chat([m for m in messages if isinstance(m, dict)])]
    raw = body.get("input")
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
        return [tokens.completion_prompt_text(raw) or ""]
    if isinstance(raw, list) and raw and all(isinstance(t, str | list) for t in raw):
        texts = [t if isinstance(t, str) else tokens.completion_prompt_text(t) for t in raw]
        if all(isinstance(t, str) for t in texts):
            return [str(t) for t in texts]
    raise ApiError(400, "input must be a string, a list of strings, token ids or lists of "
                   "token ids", "input")


def _dims(value: Any) -> int:
    if value is None:
        return EMBEDDING_DIMS
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_DIMS:
        raise ApiError(400, f"dimensions must be between 1 and {MAX_DIMS}", "dimensions")
    return value


def _encoding(value: Any) -> bool:
    """True for base64, False for floats."""
    if value in (None, "float"):
        return False
    if value == "base64":
        return True
    raise ApiError(400, "encoding_format must be 'float' or 'base64'", "encoding_format")


def relevance(query: str, document: str) -> float:
    """The share of ``query``'s words that ``document`` holds, in [0, 1]."""
    wanted = set(_WORD.findall(query.lower()))
    if not wanted:
        return 0.0
    return len(wanted & set(_WORD.findall(document.lower()))) / len(wanted)


def _text(item: Any) -> str:
    return item if isinstance(item, str) else json.dumps(item, sort_keys=True)


def _items(value: Any, name: str) -> list[str]:
    if isinstance(value, str | dict):
        return [_text(value)]
    if isinstance(value, list) and value:
        return [_text(v) for v in value]
    raise ApiError(400, f"{name} must be a string or a non-empty list", name)


SCORE_PAIRS = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"),
               ("text_1", "text_2"))


def score_pairs(body: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The (query, document) pairs of a score request: one query with each document, or the
    two lists item by item."""
    for first, second in SCORE_PAIRS:
        if first in body and second in body:
            queries, documents = _items(body[first], first), _items(body[second], second)
            if len(queries) == 1:
                return [(queries[0], d) for d in documents]
            if len(queries) != len(documents):
                raise ApiError(400, f"{first} and {second} must be of the same length", first)
            return list(zip(queries, documents, strict=True))
    raise ApiError(400, "queries and documents are required", "queries")


def _pair_tokens(pairs: Sequence[tuple[str, str]]) -> int:
    return sum(tokens.estimate_tokens(q + d) for q, d in pairs)


def score(body: Mapping[str, Any], dialect: Dialect, info: ModelInfo, rid: str,
          created: int) -> JSON:
    model = model_of(body, dialect, info)
    pairs = score_pairs(body)
    data = [{"index": i, "object": "score", "score": relevance(q, d)}
            for i, (q, d) in enumerate(pairs)]
    return {"id": f"score-{rid}", "object": "list", "created": created, "model": model,
            "data": data, "usage": shapes.usage(dialect, _pair_tokens(pairs), 0)}


def rerank(body: Mapping[str, Any], dialect: Dialect, info: ModelInfo, rid: str) -> JSON:
    model = model_of(body, dialect, info)
    query = _items(body.get("query"), "query")[0]
    documents = _items(body.get("documents"), "documents")
    top_n = body.get("top_n") or 0
    if not isinstance(top_n, int) or top_n < 0:
        raise ApiError(400, "top_n must be a non-negative integer", "top_n")
    scores = [relevance(query, d) for d in documents]
    order = sorted(range(len(documents)), key=lambda i: -scores[i])  # stable: ties by index
    results = [{"index": i, "document": {"text": documents[i], "multi_modal": None},
                "relevance_score": scores[i]} for i in order]
    prompt = _pair_tokens([(query, d) for d in documents])
    return {"id": f"score-{rid}", "model": model,
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
            "results": results[:top_n] if top_n else results}
