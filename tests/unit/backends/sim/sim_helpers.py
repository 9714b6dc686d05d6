"""Builders shared by the simulator's tests: pools, engines, requests."""

from __future__ import annotations

import random
from typing import Any

from backends.sim import tokens
from backends.sim.configure import engine_config
from backends.sim.engine import EngineCore
from backends.sim.metric_tables import METRIC_TABLES, resolve_buckets
from backends.sim.profiles import HARDWARE, MODELS
from backends.sim.request import SimRequest
from backends.sim.stats import EngineStats
from config.facts import SimulatorKnobs
from config.levers import ChunkedPrefill, Levers, Speculative
from config.pools import Pool


def make_pool(
    *,
    engine: str = "vllm",
    model: str = "llama-3-8b",
    hardware: str = "a100-80gb",
    prefix_caching: bool = False,
    chunk: int | None = None,
    spec_k: int | None = None,
    spec_method: str = "eagle",
    role: str = "mixed",
    knobs: dict[str, Any] | None = None,
    name: str = "p",
    port: int = 1,
    **extra: Any,
) -> Pool:
    levers = Levers(
        prefix_caching=prefix_caching,
        chunked_prefill=ChunkedPrefill(token_budget=chunk) if chunk else None,
        speculative=Speculative(method=spec_method, num_draft_tokens=spec_k) if spec_k else None,
    )
    return Pool(
        name=name,
        engine=engine,
        role=role,
        models=["m"],
        endpoints=[f"http://127.0.0.1:{port}"],
        levers=levers,
        model=MODELS[model],
        hardware=HARDWARE[hardware].facts,
        simulator=SimulatorKnobs(**(knobs or {})),
        **extra,
    )


def make_core(pool: Pool, seed: int = 0) -> EngineCore:
    cfg = engine_config(pool)
    buckets = resolve_buckets(METRIC_TABLES[pool.engine], pool.model.max_context)
    return EngineCore(cfg, EngineStats.with_buckets(buckets, cfg.scheduler.spec_k), seed=seed)


def make_request(
    rid: str, prompt_tokens: int, max_tokens: int, *, prefix: str = "", fill: str | None = None
) -> SimRequest:
    """A request whose prompt is ``prefix`` then filler, ``prompt_tokens`` tokens in all."""
    filler = (fill or rid[:1] or "x") * (4 * prompt_tokens - len(prefix))
    toks = tokens.stream_tokens(prefix + filler)
    return SimRequest(
        rid=rid,
        tokens=toks,
        prompt_tokens=len(toks),
        max_tokens=max_tokens,
        finish_reason="length",
        arrival=0.0,
        rng=random.Random(rid),
        requested_max_tokens=max_tokens,
    )


def with_capacity(pool: Pool, *, kv_cache_bytes: float | None = None,
                  host_link_bandwidth: float | None = None, **levers: Any) -> Pool:
    """``pool`` (validated again) with capacity levers (``kv_cache_dtype``, ``host_kv_cache``)
    and, optionally, its hardware's KV cache size [B] and host link bandwidth [B/s]."""
    raw = pool.model_dump(mode="json")
    raw["levers"] = {**raw["levers"], **levers}
    hardware = {"kv_cache_bytes": kv_cache_bytes, "host_link_bandwidth": host_link_bandwidth}
    raw["hardware"] = {**raw["hardware"], **{k: v for k, v in hardware.items() if v is not None}}
    return Pool.model_validate(raw)
