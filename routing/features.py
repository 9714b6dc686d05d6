"""Request features: what the router measures of one request before choosing where it goes.

(The extraction itself is built in its own issue; this module holds the shared type.)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """One request as the router sees it.

    ``block_hashes`` are chained hashes of the canonical prompt text cut into fixed-size
    blocks: hash i covers blocks 0..i, so equal hashes mean equal prefixes. Token counts are
    estimates (see :mod:`routing.features`). ``expected_output_tokens`` is ``max_tokens`` when
    given, else the learned mean for the model, else a default.
    """

    model: str
    block_hashes: tuple[int, ...]
    block_tokens: int
    prompt_tokens: int
    expected_output_tokens: int
    max_tokens: int | None
    session: str | None
    stream: bool
