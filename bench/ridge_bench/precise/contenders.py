"""The routers of the precise-routing run and how each is configured for the engine pair.

- ``ridge``: ``ridge serve`` with the pair's pool (KV events included) and the model's
  tokenizer from the engines' model folder (:func:`ridge_fleet`), every other setting default:
  its router follows both engines' events and matches each request's exact tokens; its
  admission control refuses (503 at once) a request that would wait too long.
- ``ridge-open``: the same with admission control off (``RIDGE_ADMISSION__ENABLED=false``):
  every request reaches an engine, as behind vLLM's router.
- ``vllm-kv``: vLLM's router with ``--policy kv_aware`` (:func:`kv_aware_args`): a
  ``--kv-event-source URL=ENDPOINT`` and a ``--kv-event-replay-source`` per engine,
  ``--kv-event-block-size 128`` and ``--kv-event-model``. It tokenizes through each engine's
  ``/v1/chat/completions/render`` (HTTP workers: no tokenizer in the router) and credits the
  blocks the events say an engine holds; ``--log-level debug`` makes it log each decision's
  outcome (:func:`decision_outcomes`).
- ``vllm-rr``: the same router, round robin: the baseline.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from config.pools import Pool
from ridge_bench.harness.fleets import with_tokenizer
from ridge_bench.harness.gateways import ROUTERS
from ridge_bench.precise.engines import BLOCK_TOKENS

VLLM_ROUTER = ROUTERS["vllm-router"]
DECISION = re.compile(r'KV prefix decision\s+outcome="([a-z_]+)"')
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Contender:
    """One router of the run: its key, its row label, its kind (``ridge`` or a key of
    :data:`ridge_bench.harness.gateways.ROUTERS`), its policy (routers only) and settings
    (ridge only: ``RIDGE_*`` variables)."""

    key: str
    label: str
    kind: str
    policy: str = ""
    env: Mapping[str, str] = field(default_factory=dict)


CONTENDERS: Mapping[str, Contender] = {c.key: c for c in (
    Contender("ridge", "ridge, KV events", "ridge"),
    Contender("ridge-open", "ridge, KV events, admission off", "ridge",
              env={"RIDGE_ADMISSION__ENABLED": "false"}),
    Contender("vllm-kv", VLLM_ROUTER.label("kv_aware"), VLLM_ROUTER.kind, "kv_aware"),
    Contender("vllm-rr", VLLM_ROUTER.label("round_robin"), VLLM_ROUTER.kind, "round_robin"),
)}


def ridge_fleet(pool: Mapping[str, Any], tokenizer: Path) -> dict[str, Any]:
    """ridge's fleet file: the pair's pool, ``tokenizer`` required for its models."""
    return with_tokenizer({"pools": [dict(pool)]}, tokenizer)


def kv_aware_args(pool: Pool) -> list[str]:
    """vLLM router flags that make ``kv_aware`` follow the pool's engines (module doc)."""
    args: list[str] = []
    for url, source in pool.kv_event_sources(pool.endpoint_urls()).items():
        args += ["--kv-event-source", f"{url}={source.publish}"]
        if source.replay is not None:
            args += ["--kv-event-replay-source", f"{url}={source.replay}"]
    return args + ["--kv-event-block-size", str(BLOCK_TOKENS),
                   "--kv-event-model", pool.models[0], "--log-level", "debug"]


def router_args(contender: Contender, pool: Pool) -> list[str]:
    """The policy flags of ``contender`` (none but ``kv_aware``'s)."""
    return kv_aware_args(pool) if contender.policy == "kv_aware" else []


def decision_outcomes(log: str) -> dict[str, int]:
    """How many ``kv_aware`` decisions of a router log had each outcome (``prefix_cost``: it
    had the prompt's tokens and scored the engines' blocks; ``missing_tokens``: it could not
    tokenize and fell back)."""
    return dict(Counter(DECISION.findall(ANSI.sub("", log))))
