"""What a whole answer of each API looks like, so that a broken 200 is never a success.

An engine can answer 200 and then send nothing, break off, or send something that is not the
API's answer. :func:`broken_whole` checks a whole JSON answer by bytes alone (no parse, on the
hot path): an object, from its first byte to its last, holding its API's member
(:data:`MEMBER`: ``choices`` for chat and completions, ``output`` for Responses, ...).
:func:`chat_stream_ended` and :func:`responses_stream_ended` find a stream's last event:
``data: [DONE]``, or a ``response.completed`` / ``failed`` / ``incomplete`` event. Both match only
outside JSON strings (a string escapes its quotes and newlines), so generated text cannot
fake them. Reasons (:data:`REASONS`) label ``ridge_upstream_broken_answers_total``.
See docs/gateway.md#broken-answers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

from gateway.request.body import ApiPath

EMPTY, CUT_SHORT, NOT_THE_API, NO_END = "empty", "cut_short", "not_the_api", "no_end"
REASONS = (EMPTY, CUT_SHORT, NOT_THE_API, NO_END)
"""Why an answer was broken: no bytes; a JSON object that does not end; not the API's answer;
a stream without its last event."""

MEMBER: Mapping[ApiPath, bytes] = MappingProxyType({
    ApiPath.CHAT: b'"choices"', ApiPath.COMPLETIONS: b'"choices"',
    ApiPath.RESPONSES: b'"output"', ApiPath.EMBEDDINGS: b'"data"',
    ApiPath.SCORE: b'"data"', ApiPath.SCORE_V1: b'"data"', ApiPath.RERANK: b'"results"',
    ApiPath.RERANK_V1: b'"results"', ApiPath.RERANK_V2: b'"results"',
    ApiPath.TOKENIZE: b'"tokens"', ApiPath.DETOKENIZE: b'"prompt"'})
"""The member every whole 200 answer of an API holds (vLLM's and SGLang's response models)."""
_MEMBERS = dict(MEMBER)  # a dict: read for every whole answer
_SPACE = frozenset(b" \t\n\r\x0b\x0c")
"""The bytes ``bytes.strip()`` takes as white space."""

_DONE = b"[DONE]"
_DONE_LINE = (b"data: ", b"data:")
"""What the line holds before ``[DONE]`` in the last event of a chat stream."""
_RESPONSE_END = re.compile(rb'"type"\s*:\s*"response\.(?:completed|failed|incomplete)"')


def broken_whole(api_path: ApiPath, body: bytes) -> str | None:
    """Why ``body``, a whole 200 answer of ``api_path``, is not one (a :data:`REASONS`), or
    None when it looks whole."""
    start, end = 0, len(body)  # the body without its outer white space, as bytes.strip()
    while start < end and body[start] in _SPACE:
        start += 1
    while end > start and body[end - 1] in _SPACE:
        end -= 1
    if start == end:
        return EMPTY
    if body[start] != 0x7B:  # "{"
        return NOT_THE_API
    if body[end - 1] != 0x7D:  # "}"
        return CUT_SHORT
    member = _MEMBERS.get(api_path)
    return NOT_THE_API if member is not None and body.find(member, start, end) < 0 else None


def chat_stream_ended(region: bytes) -> bool:
    """Whether ``region`` (whole events of a chat or completions stream) holds its last
    event, ``data: [DONE]`` at the start of a line (found from the end by byte search: a
    regular expression anchored at line starts would try every byte of the region)."""
    at = region.rfind(_DONE)
    while at >= 0:
        start = region.rfind(b"\n", 0, at) + 1
        if at - start <= 6 and region[start:at] in _DONE_LINE:
            return True
        at = region.rfind(_DONE, 0, at)
    return False


def responses_stream_ended(region: bytes) -> bool:
    """Whether ``region`` (whole events of a Responses stream) holds its last event."""
    return region.find(b"response.") >= 0 and _RESPONSE_END.search(region) is not None
