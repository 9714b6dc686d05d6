"""The engine loop's core: one synchronous step at a time, on an injected notion of time.

:meth:`EngineCore.step` schedules a batch (:mod:`backends.sim.scheduler`), prices it with the
roofline (:mod:`backends.sim.device`, plus drafting when speculating) and applies its outcome
as of ``now + duration``: prefill progress, sampled tokens (n-gram drafts checked against the
answer, :mod:`backends.sim.ngram`, else the acceptance curve, :mod:`backends.sim.speculative`),
finished requests, counters. The caller then waits ``duration`` before stepping again; nothing
here sleeps or knows about HTTP.

With a host KV tier a step lasts max(roofline time, reload time) + drafting (the copy overlaps
the compute). A request becomes schedulable ``request_s`` after it arrives; one finished with
``hold_kv`` keeps its blocks until released (a prefill engine awaiting its decode engine).
See docs/simulator.md#the-engine-core.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

from backends.sim import speculative
from backends.sim.answers import Answer
from backends.sim.device import Device
from backends.sim.kvcache import BlockPool, reload_seconds
from backends.sim.ngram import NgramIndex, accepted_drafts
from backends.sim.request import Phase, SimRequest
from backends.sim.scheduler import EngineScheduler, EngineSchedulerConfig, Scheduled
from backends.sim.stats import EngineStats
from routing.formulas import SeqWork, StepCost


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything one simulated engine needs. Units: blocks, tokens, seconds, dimensionless."""

    device: Device
    num_blocks: int
    block_size: int
    prefix_caching: bool
    scheduler: EngineSchedulerConfig
    spec_acceptance: tuple[float, ...] = ()
    """Draft-model methods: per draft position, the chance it is accepted once the drafts
    before it were (:func:`backends.sim.speculative.sample_accepted`)."""
    ngram: tuple[int, int] | None = None
    """n-gram speculation: (min_n, max_n), and acceptance comes from the text
    (:mod:`backends.sim.ngram`); None for the other methods."""
    draft_cost: float = 0.0
    host_blocks: int = 0
    """Blocks (of ``block_size`` tokens) of the host KV tier; 0 = none."""
    host_link_bandwidth: float = 0.0
    """Host memory ↔ device bandwidth [B/s], for the host tier's reloads."""


@dataclass(slots=True)
class Emission:
    """Tokens one request produced in a step, and its finish reason if it is done."""

    request: SimRequest
    tokens: list[str]
    finish: str | None = None


@dataclass(slots=True)
class StepOutcome:
    """A step's duration [s], what it produced, and its roofline cost (None when idle)."""

    seconds: float
    emissions: list[Emission]
    cost: StepCost | None = None

    @property
    def idle(self) -> bool:
        return self.cost is None


class EngineCore:
    """Waiting queue, running batch, KV cache and counters of one engine."""

    def __init__(self, config: EngineConfig, stats: EngineStats, seed: int = 0) -> None:
        self.config = config
        self.stats = stats
        if config.host_blocks and config.host_link_bandwidth <= 0:
            raise ValueError("a host KV tier needs a positive host_link_bandwidth")
        self.pool = BlockPool(config.num_blocks, config.block_size, config.prefix_caching,
                              config.host_blocks)
        self._host_tokens: dict[str, int] = {}  # rid → prompt tokens reloaded from the host
        self.scheduler = EngineScheduler(config.scheduler, self.pool, stats)
        self.held: dict[str, list[int]] = {}
        self._rng = random.Random(seed)

    # -- requests in and out ------------------------------------------------------------------

    def add(self, req: SimRequest) -> None:
        """Queue ``req`` (arrived at ``req.arrival``)."""
        req.available_at = req.arrival + self.config.device.overheads.request_s
        self.stats.requests_received += 1
        self.stats.observe("max_tokens", req.requested_max_tokens)
        self.stats.observe("n", 1)
        if req.answer is None:
            req.answer = Answer(req.rng)
        if self.config.ngram is not None and self.config.scheduler.spec_k:
            req.drafter = NgramIndex(*self.config.ngram)
            req.drafter.extend(req.tokens)
            req.drafts = []
        self.scheduler.waiting.append(req)

    def abort(self, req: SimRequest, now: float) -> None:
        """Drop ``req`` wherever it is (the client went away); its KV is freed."""
        if req.phase is Phase.FINISHED:
            return
        sched = self.scheduler
        if req in sched.waiting:
            sched.waiting.remove(req)
        for queue in (sched.running, sched.transferring):
            if req in queue:
                queue.remove(req)
        self.pool.release(req.blocks)
        req.blocks = []
        self._close(req, "abort", now)

    def release_held(self, rid: str) -> None:
        """Free the KV a finished ``hold_kv`` request kept (its decode engine has read it)."""
        blocks = self.held.pop(rid, None)
        if blocks is not None:
            self.pool.release(blocks)

    def kv_published(self, req: SimRequest, published_at: float, now: float) -> None:
        """The prefill engine for ``req`` has finished at ``published_at``: its KV can travel."""
        if req.remote is not None:
            req.remote.published_at = published_at
            self.scheduler.arm_transfer(req, now)

    # -- the step ---------------------------------------------------------------------------

    def step(self, now: float) -> StepOutcome:
        """Run one step starting at ``now``; the outcome holds as of ``now + seconds``."""
        batch = self.scheduler.schedule(now)
        reload_s = self._reloads(batch, now)
        if not batch:
            return StepOutcome(0.0, [])
        work = [SeqWork(q, req.num_computed) for req, q in batch]
        cost = self.config.device.step_cost(work)
        seconds = max(cost.seconds, reload_s) + self._draft_seconds(batch)
        end = now + seconds
        emissions = [e for req, q in batch if (e := self._advance(req, q, end)) is not None]
        self._count_step(cost, batch, emissions, now, end)
        return StepOutcome(seconds, emissions, cost)

    def _reloads(self, batch: list[Scheduled], now: float) -> float:
        """The host tier's reloads during this step's scheduling: claimed as host hits by the
        requests admitted now, and their copy time [s] (module docstring)."""
        pool = self.pool
        if pool.host is None:
            return 0.0
        tokens = pool.take_reloaded_tokens()
        if tokens:
            for req in [r for r, _ in batch] + self.scheduler.transferring:
                if req.first_scheduled == now:
                    self._claim_host_hits(req)
        pool.forget_reloaded()
        if not tokens:
            return 0.0
        kv = self.config.device.shape.kv_bytes_per_token
        seconds = reload_seconds(tokens, kv, self.config.host_link_bandwidth)
        self.stats.host_load_bytes += tokens * kv
        self.stats.host_load_seconds += seconds
        return seconds

    def _claim_host_hits(self, req: SimRequest) -> None:
        cached_blocks = req.blocks[: req.cached_tokens // self.pool.block_size]
        hits = self.pool.claim_reloaded(cached_blocks) * self.pool.block_size
        if hits:
            self.stats.host_hits += hits
            self._host_tokens[req.rid] = hits

    def _draft_seconds(self, batch: list[Scheduled]) -> float:
        """Drafting time [s] = c · K · (roofline time of a plain decode step of the speculating
        sequences)."""
        k = self.config.scheduler.spec_k
        if not k or not self.config.draft_cost:
            return 0.0
        drafting = [
            SeqWork(1, r.num_computed) for r, q in batch if q > len(r.tokens) - r.num_computed
        ]
        if not drafting:
            return 0.0
        plain = self.config.device.step_cost(drafting)
        return self.config.draft_cost * k * max(plain.compute_s, plain.memory_s)

    def _advance(self, req: SimRequest, q: int, end: float) -> Emission | None:
        pending = len(req.tokens) - req.num_computed
        if q < pending:
            req.num_computed += q
            self._name_blocks(req)
            return None
        answer = req.answer
        assert answer is not None, "add() gives every request its answer"
        drafts = q - pending
        accepted = self._verify(req, answer, drafts)
        new = answer.tokens(req.generated, min(accepted + 1, req.remaining))
        req.tokens.extend(new)
        if req.drafter is not None:
            req.drafter.extend(new)
            req.drafts = req.drafter.propose(self.config.scheduler.spec_k)
        req.num_computed = len(req.tokens) - 1
        self._name_blocks(req)
        self._observe_tokens(req, len(new), end)
        if req.remaining > 0:
            return Emission(req, new)
        self._finish(req, end)
        return Emission(req, new, req.finish_reason)

    def _verify(self, req: SimRequest, answer: Answer, drafts: int) -> int:
        """Drafts accepted of the ``drafts`` verified: n-gram drafts where they equal the
        answer's next tokens, else drawn from the pool's per-position acceptance."""
        if not drafts:
            return 0
        if req.drafts is not None:
            accepted = accepted_drafts(req.drafts[:drafts], answer.tokens(req.generated, drafts))
        else:
            accepted = speculative.sample_accepted(self._rng, self.config.spec_acceptance, drafts)
        st = self.stats
        st.spec_drafts += 1
        st.spec_draft_tokens += drafts
        st.spec_accepted += accepted
        for pos in range(accepted):
            st.spec_accepted_per_pos[pos] += 1
        return accepted

    def _name_blocks(self, req: SimRequest) -> None:
        """Give every newly full, computed block its prefix-cache name."""
        if not self.pool.caching:
            return
        full = min(req.num_computed // self.pool.block_size, len(req.blocks))
        if full <= req.named_blocks:
            return
        self.scheduler.extend_hashes(req)
        for j in range(req.named_blocks, full):
            self.pool.name(req.blocks[j], req.hashes[j], req, j)
        req.named_blocks = full

    def _finish(self, req: SimRequest, end: float) -> None:
        self.scheduler.running.remove(req)
        if req.hold_kv:
            self.held[req.rid] = req.blocks
        else:
            self.pool.release(req.blocks)
        req.blocks = []
        self._close(req, req.finish_reason, end)

    def _close(self, req: SimRequest, reason: str, t: float) -> None:
        req.phase = Phase.FINISHED
        req.final_reason = reason
        req.finished_at = t
        self._host_tokens.pop(req.rid, None)
        self.stats.finished[reason] += 1
        self._observe_finish(req, t)
        if req.on_finish is not None:
            req.on_finish(req)

    # -- counters ----------------------------------------------------------------------------

    def _observe_tokens(self, req: SimRequest, count: int, end: float) -> None:
        st = self.stats
        st.generation_tokens += count
        if req.first_token_at is None:
            req.first_token_at = end
            st.observe("ttft_s", end - req.arrival)
            st.observe("prefill_s", end - (req.first_scheduled or req.arrival))
            self._count_prompt(req)
        elif req.last_token_at is not None:
            st.observe("itl_s", end - req.last_token_at)
        req.last_token_at = end

    def _count_prompt(self, req: SimRequest) -> None:
        st = self.stats
        st.prompt_tokens += req.prompt_tokens
        st.prompt_tokens_cached += req.cached_tokens
        st.prompt_tokens_host += self._host_tokens.pop(req.rid, 0)
        st.prompt_tokens_transferred += req.transferred_tokens
        local = req.prompt_tokens - req.cached_tokens - req.transferred_tokens
        st.prompt_tokens_computed += max(0, local)

    def _observe_finish(self, req: SimRequest, t: float) -> None:
        st = self.stats
        started = req.first_scheduled if req.first_scheduled is not None else t
        st.observe("e2e_s", t - req.arrival)
        st.observe("queue_s", started - req.arrival)
        st.observe("inference_s", t - started)
        st.observe("prompt_tokens", req.prompt_tokens)
        st.observe("generation_tokens", req.generated)
        st.observe("preemptions", req.preemptions)
        computed = req.prompt_tokens - req.cached_tokens - req.transferred_tokens
        st.observe("prefill_computed_tokens", max(0, computed))
        if req.first_token_at is not None:
            st.observe("decode_s", t - req.first_token_at)
            if req.generated > 1:
                st.observe("tpot_s", (t - req.first_token_at) / (req.generated - 1))

    def _count_step(
        self,
        cost: StepCost,
        batch: Iterable[Scheduled],
        emissions: list[Emission],
        start: float,
        end: float,
    ) -> None:
        st = self.stats
        st.flops += cost.flops
        st.read_bytes += cost.read_bytes
        st.write_bytes += cost.write_bytes
        st.observe("iteration_tokens", sum(q for _, q in batch))
        produced = sum(len(e.tokens) for e in emissions)
        if produced:
            st.recent_decode.append((start, end, produced))

    # -- gauges ------------------------------------------------------------------------------

    def next_event_time(self, now: float) -> float | None:
        return self.scheduler.next_event_time(now)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_transferring(self) -> int:
        return len(self.scheduler.transferring)

    @property
    def used_tokens(self) -> int:
        return (self.pool.num_blocks - self.pool.num_free) * self.pool.block_size

    @property
    def capacity_tokens(self) -> int:
        return self.pool.num_blocks * self.pool.block_size
