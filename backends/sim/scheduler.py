"""Continuous-batching scheduler: which requests run in the next step, and with how many tokens.

:class:`EngineScheduler` follows vLLM V1's scheduler, with SGLang's prefill-first variant:
requests whose remote KV arrived join the batch; running requests go first, oldest first
(the rest of a prompt, one decode token, or 1 + K to verify), the newest preempted when the KV
cache has no room; then, if nothing was preempted, waiting requests are admitted in arrival
order within the token budget, ``max_num_seqs`` and the KV cache, the prefix cache supplying
the blocks it holds. ``mixed_batches`` (vLLM) mixes prefill chunks and decodes in a step,
otherwise a step is prefill or decode; ``wake_takes_one`` (vLLM) admits only the first request
of a burst that arrives while the engine is idle.

Parameters: :class:`EngineSchedulerConfig` (tokens, requests, bytes). See
docs/simulator.md#the-scheduler for the algorithm step by step and a worked example.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from backends.sim.kvcache import BlockPool, chain_hashes
from backends.sim.request import Phase, SimRequest
from backends.sim.stats import EngineStats

NO_LIMIT = 1 << 60


@dataclass(frozen=True, slots=True)
class EngineSchedulerConfig:
    token_budget: int
    max_num_seqs: int
    chunked: bool
    mixed_batches: bool
    spec_k: int = 0
    kv_bytes_per_token: float = 0.0
    wake_takes_one: bool = False


Scheduled = tuple[SimRequest, int]
"""A request and the number of tokens it computes in this step."""


class EngineScheduler:
    """The waiting queue, the running batch and the requests awaiting remote KV."""

    def __init__(self, config: EngineSchedulerConfig, pool: BlockPool, stats: EngineStats) -> None:
        self.config = config
        self.pool = pool
        self.stats = stats
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.transferring: list[SimRequest] = []
        self.idle_since: float | None = -math.inf
        """Since when the engine has had nothing to run (None while it is busy)."""

    def schedule(self, now: float) -> list[Scheduled]:
        """The next step's batch (possibly empty)."""
        self._land_transfers(now)
        if self.config.mixed_batches:
            batch, budget, preempted = self._schedule_running(
                self.running, self.config.token_budget
            )
            if not preempted:
                batch += self._admit(now, budget)
            batch = self._alive(batch)
        else:
            batch = self._schedule_prefill_first(now)
        self._note_idle(now, batch)
        return batch

    def _note_idle(self, now: float, batch: list[Scheduled]) -> None:
        if batch or self.running or self.transferring:
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = now

    def _schedule_prefill_first(self, now: float) -> list[Scheduled]:
        prefilling = [r for r in self.running if r.is_prefilling]
        batch, budget, _ = self._schedule_running(prefilling, self.config.token_budget)
        batch += self._admit(now, budget)
        if batch:
            return self._alive(batch)
        batch, _, _ = self._schedule_running(list(self.running), NO_LIMIT)
        return self._alive(batch)

    def _schedule_running(
        self, requests: list[SimRequest], budget: int
    ) -> tuple[list[Scheduled], int, bool]:
        batch: list[Scheduled] = []
        before = self.stats.preemptions
        for req in list(requests):
            if budget <= 0:
                break
            if req.phase is not Phase.RUNNING:
                continue
            q = min(self._wanted(req), budget)
            if self._reserve(req, q):
                batch.append((req, q))
                budget -= q
        return batch, budget, self.stats.preemptions != before

    def _wanted(self, req: SimRequest) -> int:
        q = len(req.tokens) - req.num_computed
        if q == 1 and req.generated > 0 and self.config.spec_k:
            drafts = self.config.spec_k if req.drafts is None else len(req.drafts)
            q += max(0, min(drafts, req.remaining - 1))
        return q

    def _reserve(self, req: SimRequest, q: int) -> bool:
        """Blocks for ``req``'s next ``q`` tokens, preempting the newest requests if needed."""
        need = self.pool.blocks_for(req.num_computed + q) - len(req.blocks)
        while need > self.pool.num_free:
            victim = self.running[-1]
            self.preempt(victim)
            if victim is req:
                return False
        if need > 0:
            fresh = self.pool.allocate(need)
            assert fresh is not None
            req.blocks.extend(fresh)
        return True

    def preempt(self, req: SimRequest) -> None:
        """Free ``req``'s KV and queue it first, to be recomputed (vLLM's recompute preemption)."""
        self.running.remove(req)
        self.pool.release(req.blocks)
        req.blocks = []
        req.num_computed = 0
        req.named_blocks = 0  # its recomputed blocks are cached again, as vLLM caches them
        req.phase = Phase.WAITING
        req.preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(req)

    def _admit(self, now: float, budget: int) -> list[Scheduled]:
        batch: list[Scheduled] = []
        queried = hits = 0
        woken = 0  # requests admitted that became available while the engine was idle
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            if req.available_at > now:
                break
            if self._woke_on(req):
                if woken:
                    break
                woken += 1
            q = self._start(req, budget, now)
            if q is None:
                break
            self.waiting.popleft()
            queried += len(req.tokens)
            hits += req.num_computed
            if req.phase is Phase.RUNNING:
                batch.append((req, q))
                budget -= q
        if queried and self.pool.caching:
            self.stats.last_prefill_hit_rate = hits / queried
        return batch

    def _woke_on(self, req: SimRequest) -> bool:
        """Whether ``req`` became available while the engine was idle (and so woke it), when
        the engine takes only one such request into its first step (see 5 above)."""
        idle = self.idle_since
        return self.config.wake_takes_one and idle is not None and req.available_at > idle

    def _start(self, req: SimRequest, budget: int, now: float) -> int | None:
        """Admit ``req`` if it fits: its tokens this step, 0 if it awaits remote KV, else None."""
        self.extend_hashes(req)
        matched = self.pool.match(req.hashes, len(req.tokens) - 1, req)
        computed = len(matched) * self.pool.block_size
        if req.remote is not None:
            target = len(req.tokens) - 1
            q = 0
        else:
            q = len(req.tokens) - computed
            if not self.config.chunked and q > budget:
                return None
            q = min(q, budget)
            target = computed + q
        needed = self.pool.blocks_for(target) - len(matched)
        if self.pool.host is None and not self.pool.fits(matched, needed):
            return None
        self.pool.take(matched)
        fresh = self.pool.allocate(needed)
        if fresh is None:
            self.pool.release(matched)
            return None
        req.blocks = matched + fresh
        req.num_computed = computed
        self._record_admission(req, computed, now)
        if req.remote is not None:
            self._begin_transfer(req, now)
            return 0
        req.phase = Phase.RUNNING
        self.running.append(req)
        return q

    def _record_admission(self, req: SimRequest, computed: int, now: float) -> None:
        """Prefix-cache queries and hits at a request's admission, as vLLM 0.32 counts them:
        a preempted request's re-admission is left out (``PrefixCacheStats.record(preempted=
        True)`` counts it apart, outside ``vllm:prefix_cache_*``)."""
        if self.pool.caching and req.preemptions == 0:
            self.stats.prefix_queries += len(req.tokens)
            self.stats.prefix_hits += computed
        if req.first_scheduled is None:
            req.first_scheduled = now
            req.cached_tokens = computed

    def _begin_transfer(self, req: SimRequest, now: float) -> None:
        assert req.remote is not None
        req.remote.transfer_tokens = len(req.tokens) - 1 - req.num_computed
        req.phase = Phase.TRANSFERRING
        self.transferring.append(req)
        self.arm_transfer(req, now)

    def arm_transfer(self, req: SimRequest, now: float) -> None:
        """Set when ``req``'s KV arrives, once its prefill engine has published it:
        ready = max(now, published) + transfer tokens · KV bytes per token ÷ link bandwidth."""
        remote = req.remote
        if remote is None or remote.published_at is None or req.phase is not Phase.TRANSFERRING:
            return
        seconds = remote.transfer_tokens * self.config.kv_bytes_per_token / remote.link_bandwidth
        remote.ready_at = max(now, remote.published_at) + seconds

    def _land_transfers(self, now: float) -> None:
        for req in [r for r in self.transferring if r.remote and r.remote.ready_at is not None]:
            assert req.remote is not None and req.remote.ready_at is not None
            if req.remote.ready_at > now:
                continue
            self.transferring.remove(req)
            req.transferred_tokens = req.remote.transfer_tokens
            if req.remote.release is not None:
                req.remote.release()
            req.remote = None
            req.num_computed = len(req.tokens) - 1
            req.phase = Phase.RUNNING
            self.running.append(req)

    def extend_hashes(self, req: SimRequest) -> None:
        """Name every full block of ``req``'s tokens (only with prefix caching on)."""
        if not self.pool.caching:
            return
        size = self.pool.block_size
        if len(req.hashes) < len(req.tokens) // size:
            parent = req.hashes[-1] if req.hashes else 0
            req.hashes.extend(chain_hashes(req.tokens, size, len(req.hashes), parent))

    def next_event_time(self, now: float) -> float | None:
        """The earliest future time a waiting request becomes runnable, if any is known."""
        times = [r.remote.ready_at for r in self.transferring if r.remote and r.remote.ready_at]
        if self.waiting and self.waiting[0].available_at > now:
            times.append(self.waiting[0].available_at)
        return min(times) if times else None

    @staticmethod
    def _alive(batch: list[Scheduled]) -> list[Scheduled]:
        return [(r, q) for r, q in batch if r.phase is Phase.RUNNING]
