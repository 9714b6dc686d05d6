"""The lever check: what a pool declares against what its running engine says (pure).

:func:`declared_facts` turns a pool of the fleet file into facts named as in
:mod:`backends.engines.facts`: ``prefix_cache``, ``chunked_prefill`` and ``speculative`` (on or
off), ``chunk_tokens`` (only with chunked prefill on), ``draft_tokens`` (only with speculative
decoding), ``max_context`` only when the fleet file sets ``model.max_context`` (its default
is not a claim about the engine; a pool without model facts declares none), and the capacity
levers ``fp8_kv_cache`` (an 8-bit ``kv_cache_dtype``) and ``host_kv_cache`` (on or off). A
declared fact no engine fact table reads (the capacity levers, until
:data:`backends.engines.facts.FACTS` names them) is never checked, but still tells a fleet
reload that the pool's engines changed.

:func:`check_levers` compares them with an engine's facts: a fact known on both sides is
*checked*; a checked fact whose values differ is a :class:`Mismatch` (lever, declared,
observed). A fact unknown on either side is neither: never a mismatch.

:attr:`LeverCheck.missing`: the router's levers (:data:`ROUTING_LEVERS`) declared on and found
off. The router stops counting on them at that endpoint (:mod:`routing.snapshots`,
:mod:`routing.policy`, :mod:`routing.router`); every other mismatch (an extra lever, another
budget, K or context length) is reported, not acted on.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.engines.facts import (
    CHUNK_TOKENS,
    DRAFT_TOKENS,
    FACTS,
    MAX_CONTEXT,
    Fact,
    Facts,
)
from config.pools import Pool
from routing.snapshots import (
    CHUNKED_PREFILL,
    FP8_KV_CACHE,
    HOST_KV_CACHE,
    PREFIX_CACHE,
    SPECULATIVE,
)

ROUTING_LEVERS = frozenset({PREFIX_CACHE, CHUNKED_PREFILL, SPECULATIVE, FP8_KV_CACHE,
                            HOST_KV_CACHE})
"""The facts that are router levers: one found off where it is declared on is *missing*."""


@dataclass(frozen=True, slots=True)
class Mismatch:
    """A fact the engine contradicts: the fleet file says ``declared``, the engine
    ``observed``."""

    lever: str
    declared: Fact
    observed: Fact

    def describe(self) -> str:
        return f"declared {_shown(self.declared)}, the engine reports {_shown(self.observed)}"


@dataclass(frozen=True, slots=True)
class LeverCheck:
    """One endpoint's check: ``checked``, the facts compared (in :data:`FACTS` order);
    ``mismatches``; ``missing``, the router levers declared on and found off."""

    checked: tuple[str, ...] = ()
    mismatches: tuple[Mismatch, ...] = ()
    missing: frozenset[str] = frozenset()

    def mismatched(self, lever: str) -> bool:
        return any(m.lever == lever for m in self.mismatches)


def declared_facts(pool: Pool) -> dict[str, Fact]:
    """What ``pool`` says its engines run (see the module docstring)."""
    levers = pool.levers
    declared: dict[str, Fact] = {PREFIX_CACHE: levers.prefix_caching,
                                 CHUNKED_PREFILL: False,
                                 SPECULATIVE: levers.speculative is not None,
                                 FP8_KV_CACHE: levers.kv_dtype_bytes is not None,
                                 HOST_KV_CACHE: levers.host_kv_cache is not None}
    chunked = levers.chunked_prefill
    if chunked is not None and chunked.enabled:
        declared[CHUNKED_PREFILL] = True
        declared[CHUNK_TOKENS] = chunked.token_budget
    if levers.speculative is not None:
        declared[DRAFT_TOKENS] = levers.speculative.num_draft_tokens
    model = pool.model
    if model is not None and "max_context" in model.model_fields_set:
        declared[MAX_CONTEXT] = model.max_context
    return declared


def check_levers(declared: Facts, observed: Facts) -> LeverCheck:
    """Compare the facts known on both sides (pure; see the module docstring)."""
    checked = tuple(f for f in FACTS if f in declared and f in observed)
    mismatches = tuple(Mismatch(f, declared[f], observed[f]) for f in checked
                       if declared[f] != observed[f])
    missing = frozenset(m.lever for m in mismatches
                        if m.lever in ROUTING_LEVERS and m.declared is True)
    return LeverCheck(checked, mismatches, missing)


def _shown(value: Fact) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)

