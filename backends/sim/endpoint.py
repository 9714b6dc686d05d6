"""One simulated engine endpoint, minus HTTP: its engine, dialect, P/D agent, faults and metrics.

Requests become :class:`~backends.sim.request.SimRequest` objects here. The number of tokens a
request generates is ``max_tokens`` (finish reason ``length``), unless the pool sets
``simulator.mean_output_tokens``: then each request also draws a natural stop length L ≥ 1 from a
geometric law with that mean (P(L = l) = p(1 − p)^(l − 1), p = 1 / mean), raised to ``min_tokens``;
if L < ``max_tokens`` it stops there with finish reason ``stop``. ``ignore_eos: true`` skips the
draw. Generated text comes from the request's own random stream, seeded by ``seed`` if given,
else by the endpoint's seeded stream (fleet seed, pool seed, pool name, replica index).

Prompt tokens: the model's own (its tokenizer and chat template, :func:`tokens.model_tokens`)
when the endpoint has the pool model's tokenizer, else the 4-character estimate. With its own
tokens the request is parsed as usual, its context checks (prompt too long, ``max_tokens``
cut or refused, the default ``max_tokens``) made on the exact count, not on the estimate.

KV-cache events (:mod:`backends.sim.kv_events`): :meth:`SimEndpoint.publish_kv_events` starts
them; they need the model's tokenizer (the token ids the engine would report).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from backends.launch.vllm import offloading_gib
from backends.sim import pooling, tokens
from backends.sim.answers import Answer, Style
from backends.sim.behaviour import DIALECTS, Dialect
from backends.sim.clock import Clock
from backends.sim.configure import engine_config, facts_of, kv_cache_bytes
from backends.sim.engine import EngineCore
from backends.sim.exposition import Exposition, render
from backends.sim.faults import Faults
from backends.sim.kv_events import Publisher, SimKvEvents, TokenIds
from backends.sim.metric_tables import METRIC_TABLES, VLLM_CACHE_CONFIG_STATIC, resolve_buckets
from backends.sim.openai_api import ApiError, Generation, ModelInfo, parse_chat, parse_completion
from backends.sim.pd import PARSERS, Intent, KVTransferHub, Link, PDAgent, PDProtocolError
from backends.sim.request import SimRequest
from backends.sim.runner import EngineRunner, RequestHandle
from backends.sim.stats import EngineStats
from config.pools import Pool
from routing.tokens.exact import PromptTokenizer

FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")

Parser = Callable[[dict[str, Any], Dialect, ModelInfo, int | None], Generation]


@dataclass(frozen=True, slots=True)
class TokenizedGeneration(Generation):
    """A request whose prompt the model's own tokenizer counted: its tokens (each one's text)
    and their ids."""

    pieces: tuple[str, ...] = ()
    ids: Sequence[int] = ()


class SimEndpoint:
    """A simulated engine serving one endpoint URL of a pool."""

    def __init__(
        self,
        pool: Pool,
        index: int,
        port: int,
        clock: Clock,
        hub: KVTransferHub,
        seed: int,
        tokenizer: PromptTokenizer | None = None,
    ) -> None:
        self.pool = pool
        self.tokenizer = tokenizer
        knobs = pool.simulator
        self.style = Style(knobs.copy_slip, knobs.repeat_share, knobs.repeat_run_tokens,
                           knobs.repeat_after_tokens)
        self.dialect = DIALECTS[pool.engine]
        self.config = engine_config(pool)  # FleetConfigError for a pool without facts
        max_context = facts_of(pool)[0].max_context
        self.info = ModelInfo(tuple(pool.models), max_context,
                              tuple((a.name, a.path or a.name) for a in pool.adapters))
        self.clock = clock
        self.rng = random.Random(f"{seed}:{pool.simulator.seed}:{pool.name}:{index}")
        table = METRIC_TABLES[pool.engine]
        stats = EngineStats.with_buckets(
            resolve_buckets(table, max_context), self.config.scheduler.spec_k
        )
        self.core = EngineCore(self.config, stats, seed=self.rng.getrandbits(32))
        self.runner = EngineRunner(self.core, clock)
        self.faults = Faults()
        self.engine_id = f"{self.rng.getrandbits(128):032x}"
        link = Link(self.engine_id, "127.0.0.1", port, pool.simulator.kv_link_bandwidth)
        self.pd = PDAgent(hub, self.runner, clock, link)
        self.started = time.time()
        self.kv_events: SimKvEvents | None = None

    def publish_kv_events(self, publisher: Publisher) -> SimKvEvents:
        """Publish the engine's KV-cache events through ``publisher`` after every step; raises
        ValueError without the model's tokenizer (no token ids to report)."""
        if self.tokenizer is None:
            raise ValueError(f"pool {self.pool.name!r}: KV-cache events need the model's "
                             "tokenizer (the token ids the engine reports)")
        if self.kv_events is not None:
            raise ValueError(f"pool {self.pool.name!r}: this endpoint already publishes")
        self.kv_events = SimKvEvents(self.core.pool, TokenIds(self.tokenizer), publisher,
                                     engine=self.pool.engine)
        self.runner.after_step = self.kv_events.flush
        return self.kv_events

    # -- requests ----------------------------------------------------------------------------

    def new_id(self, kind: str) -> str:
        prefix = (
            self.dialect.chat_id_prefix if kind == "chat" else self.dialect.completion_id_prefix
        )
        return f"{prefix}{self.rng.getrandbits(128):032x}"

    def parse(self, kind: str, body: dict[str, Any]) -> Generation:
        """Validate ``body`` (raises :class:`ApiError`)."""
        parser: Parser = parse_chat if kind == "chat" else parse_completion
        prompt = tokens.model_prompt(self.tokenizer, kind, body) if self.tokenizer else None
        if prompt is None:
            return parser(body, self.dialect, self.info, None)
        return self._tokenized(body, parser, *prompt)

    def prompt_ids(self, gen: Generation) -> Sequence[int]:
        """The token ids the engine prefills for ``gen``: the model's own when its tokenizer
        counted the prompt, else the simulator's 4-character tokens'."""
        if isinstance(gen, TokenizedGeneration):
            return gen.ids
        return [pooling.token_id(chunk) for chunk in tokens.stream_tokens(gen.prompt)]

    def _tokenized(
        self, body: dict[str, Any], parser: Parser, pieces: list[str], ids: Sequence[int]
    ) -> TokenizedGeneration:
        """``body`` parsed and checked against the context with the exact prompt count (module
        docstring)."""
        gen = parser(body, self.dialect, self.info, len(pieces))
        values = {f.name: getattr(gen, f.name) for f in fields(gen)}
        return TokenizedGeneration(**values, pieces=tuple(pieces), ids=ids)

    def intent(self, body: dict[str, Any]) -> Intent | None:
        try:
            return PARSERS[self.dialect.pd_protocol](body, self.pool.role)
        except PDProtocolError as exc:
            raise ApiError(400, str(exc), "bootstrap_room") from None

    def submit(self, gen: Generation, rid: str, intent: Intent | None) -> RequestHandle:
        """Queue a validated request on the engine."""
        req = self._request(gen, rid)
        self.pd.prepare(req, intent)
        if (
            intent is not None
            and intent.side == "prefill"
            and self.dialect.pd_prefill_forces_one_token
        ):
            req.max_tokens, req.finish_reason = 1, "length"
        handle = self.runner.submit(req)
        self.pd.watch(handle, intent)
        return handle

    def _request(self, gen: Generation, rid: str) -> SimRequest:
        seed = gen.seed if gen.seed is not None else self.rng.getrandbits(64)
        rng = random.Random(seed)
        ids: Sequence[int] | None = None
        if isinstance(gen, TokenizedGeneration):
            toks, ids = list(gen.pieces), gen.ids
        else:
            toks = tokens.stream_tokens(gen.prompt)
        answer = Answer.for_prompt(toks, rng, self.style)
        target, reason = self._target_length(gen, rng, answer.natural_length())
        return SimRequest(
            rid=rid,
            tokens=toks,
            prompt_tokens=len(toks),
            max_tokens=target,
            finish_reason=reason,
            arrival=0.0,
            rng=rng,
            requested_max_tokens=gen.max_tokens,
            answer=answer,
            prompt_ids=ids,
        )

    def _target_length(self, gen: Generation, rng: random.Random,
                       copy: int | None) -> tuple[int, str]:
        """Tokens to generate and the finish reason: ``max_tokens`` with ``ignore_eos``, else
        a copy's own length (``copy``), else a draw of the pool's stop law, when shorter."""
        mean = self.pool.simulator.mean_output_tokens
        if gen.ignore_eos or (mean is None and copy is None):
            return gen.max_tokens, "length"
        natural = copy if copy is not None else _geometric(rng, mean or 1.0)
        natural = max(natural, gen.min_tokens, 1)
        if natural < gen.max_tokens:
            return natural, "stop"
        return gen.max_tokens, "length"

    async def health_generate(self) -> str:
        """SGLang's ``/health_generate``: run a one-token generation through the engine."""
        gen = self.parse("completion", {"prompt": "ping", "max_tokens": 1})
        handle = self.submit(gen, self.new_id("completion"), None)
        try:
            _, finish = await handle.collect()
        finally:
            self.runner.abort(handle)
        return finish

    # -- metrics -----------------------------------------------------------------------------

    def metrics_text(self, names: frozenset[str] | None = None) -> str:
        """The ``/metrics`` page (with ``names``: only those families,
        :func:`~backends.sim.exposition.render`)."""
        table = METRIC_TABLES[self.pool.engine]
        base = {
            "engine": "0",
            "model_name": self.pool.models[0],
            "engine_type": self.dialect.engine_type_label.get(self.pool.role, "unified"),
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        exp = Exposition(table, base, self.snapshot(), self.core.stats.histograms, self.started)
        return render(exp, names)

    def snapshot(self) -> dict[str, Any]:
        """Every value the metric tables read, by source name."""
        core, st = self.core, self.core.stats
        snap: dict[str, Any] = {
            "zero": 0.0,
            "running": core.num_running,
            "waiting": core.num_waiting + core.num_transferring,
            "queued": core.num_waiting,
            "transferring": core.num_transferring,
            "held": len(core.held),
            "waiting_by_reason": {"capacity": core.num_waiting, "deferred": core.num_transferring},
            "sleep_state": {"awake": 1, "weights_offloaded": 0, "discard_all": 0},
            "kv_usage": core.pool.usage,
            "used_tokens": core.used_tokens,
            "capacity_tokens": core.capacity_tokens,
            "cache_hit_rate": st.last_prefill_hit_rate,
            "gen_throughput": st.gen_throughput(),
            "cache_config": self._cache_config(),
            "admission_rejections": {"max_num_queued_reqs": 0, "max_num_queued_tokens": 0},
        }
        snap.update(self._counters(st))
        return snap

    def _counters(self, st: EngineStats) -> dict[str, Any]:
        cached = st.prompt_tokens_cached + st.prompt_tokens_transferred
        device = st.prompt_tokens_cached - st.prompt_tokens_host  # the rest came from the host
        return {
            "prefix_queries": st.prefix_queries,
            "prefix_hits": st.prefix_hits - st.host_hits,
            **self._host_tier(st),
            "preemptions": st.preemptions,
            "prompt_tokens": st.prompt_tokens,
            "generation_tokens": st.generation_tokens,
            "prompt_cached": cached,
            "prompt_by_source": {
                "local_compute": st.prompt_tokens_computed,
                "local_cache_hit": device,
                "external_kv_transfer": st.prompt_tokens_transferred + st.prompt_tokens_host,
            },
            "cached_by_source": {
                "device": device,
                "host": st.prompt_tokens_host,
                "p2p": st.prompt_tokens_transferred,
                "disk": 0,
                "external_unspecified": 0,
            },
            "cached_by_cache_source": {
                "device": device + st.prompt_tokens_transferred,
                **({"host": st.prompt_tokens_host} if self.core.pool.host else {}),
            },
            "realtime_tokens": {
                "prefill_compute": st.prompt_tokens_computed,
                "prefill_cache": cached,
                "decode": st.generation_tokens,
            },
            "finished": {r: st.finished.get(r, 0) for r in FINISH_REASONS},
            "requests_finished": sum(st.finished.values()),
            "aborted": st.finished.get("abort", 0),
            "flops": st.flops,
            "read_bytes": st.read_bytes,
            "write_bytes": st.write_bytes,
            "speculating": bool(self.config.scheduler.spec_k),
            "spec_drafts": st.spec_drafts,
            "spec_draft_tokens": st.spec_draft_tokens,
            "spec_accepted": st.spec_accepted,
            "spec_accepted_per_pos": dict(enumerate(st.spec_accepted_per_pos)),
            "spec_accept_length": st.spec_accept_length(),
            "spec_accept_rate": st.spec_accept_rate(),
        }

    def _host_tier(self, st: EngineStats) -> dict[str, Any]:
        """The host KV tier's values: vLLM counts its hits as a KV connector's (external)
        prefix-cache hits, queried on the tokens the device cache did not hold."""
        pool = self.core.pool
        on = pool.host is not None
        return {
            "host_tier": on,
            "external_queries": st.prefix_queries - (st.prefix_hits - st.host_hits) if on else 0,
            "external_hits": st.host_hits,
            "host_used_tokens": pool.host_used_blocks * pool.block_size,
            "host_total_tokens": pool.host_capacity_blocks * pool.block_size,
            "host_load_bytes": st.host_load_bytes,
            "host_load_seconds": st.host_load_seconds,
        }

    def _cache_config(self) -> dict[str, str]:
        """vLLM's ``cache_config_info`` labels, with this engine's values."""
        cfg = self.config
        capacity = cfg.num_blocks * cfg.block_size
        return {
            **VLLM_CACHE_CONFIG_STATIC,
            "block_size": str(cfg.block_size),
            "effective_attention_block_size": str(cfg.block_size),
            "cache_dtype": self.pool.levers.kv_cache_dtype,
            "enable_prefix_caching": str(cfg.prefix_caching),
            "gpu_memory_utilization": str(self.dialect.memory_fraction),
            "kv_cache_max_concurrency": str(round(capacity / self.info.max_context, 2)),
            "kv_cache_memory_bytes": str(int(kv_cache_bytes(self.pool, self.dialect))),
            "kv_cache_size_tokens": str(capacity),
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(cfg.num_blocks),
            "num_gpu_blocks_override": "None",
            "prefix_caching_hash_algo": "sha256",
            "sliding_window": "None",
            **self._offloading_labels(),
        }

    def _offloading_labels(self) -> dict[str, str]:
        """``kv_offloading_size`` [GiB, as vLLM prints the float] and ``_backend``."""
        tier, mechanism = self.pool.levers.host_kv_cache, self.pool.host_kv_mechanism()
        if tier is None or mechanism is None:
            return {"kv_offloading_backend": "native", "kv_offloading_size": "None"}
        return {"kv_offloading_backend": mechanism, "kv_offloading_size": offloading_gib(tier)}


def _geometric(rng: random.Random, mean: float) -> int:
    """A draw ≥ 1 of the geometric law with the given mean (p = 1 / mean)."""
    if mean <= 1.0:
        return 1
    p = 1.0 / mean
    return 1 + int(math.log(1.0 - rng.random()) / math.log(1.0 - p))
