"""What a pool's engine replicas are: which engine serves (:class:`Engine`, the ``engine:``
key) and which part of a request they take (:class:`Role`, the ``role:`` key).

``mixed`` engines take whole requests; a ``prefill`` pool computes a prompt's KV and hands it
to the ``decode`` pool it names as its ``pair`` (checked across the fleet, :mod:`config.fleet`).
The backends key their per-engine tables on :class:`Engine` (:mod:`backends.engines.dialects`,
:mod:`backends.launch.recipes`). See docs/fleet-file.md.
"""

from __future__ import annotations

from enum import StrEnum


class Engine(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"


class Role(StrEnum):
    MIXED = "mixed"
    PREFILL = "prefill"
    DECODE = "decode"
