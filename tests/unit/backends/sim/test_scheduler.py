"""The scheduler on virtual time: how a burst of new prompts is ordered and batched within the
token budget (vLLM: the first request of a burst is prefilled alone, then FCFS within the budget;
SGLang: every available request), worked through step by step."""

from __future__ import annotations

from backends.sim.engine import EngineCore
from backends.sim.kvcache import BlockPool
from backends.sim.scheduler import EngineScheduler, EngineSchedulerConfig, Scheduled
from backends.sim.stats import EngineStats
from backends.sim.virtual import Trace, simulate
from config.pools import Pool
from tests.unit.backends.sim.sim_helpers import make_core, make_pool, make_request

BUDGET = 512  # tokens per step: the real-demo fleet's chunked-prefill budget

Step = list[tuple[str, int]]


class RecordingScheduler(EngineScheduler):
    """The scheduler, keeping every non-empty batch as (request id, tokens) pairs."""

    def __init__(self, config: EngineSchedulerConfig, pool: BlockPool, stats: EngineStats) -> None:
        super().__init__(config, pool, stats)
        self.steps: list[Step] = []

    def schedule(self, now: float) -> list[Scheduled]:
        batch = super().schedule(now)
        if batch:
            self.steps.append([(r.rid, q) for r, q in batch])
        return batch


def cpu_pool(engine: str = "vllm") -> Pool:
    """The real-demo fleet's "plain" pool: SmolLM2 on the calibrated CPU, 512-token chunks."""
    return make_pool(engine=engine, model="smollm2-135m", hardware="cpu-smollm2",
                     prefix_caching=True, chunk=BUDGET)


def recording_core(pool: Pool) -> tuple[EngineCore, RecordingScheduler]:
    core = make_core(pool)
    recorder = RecordingScheduler(core.config.scheduler, core.pool, core.stats)
    core.scheduler = recorder
    return core, recorder


def burst(core: EngineCore, lengths: list[int], at: float = 0.0, tag: str = "r") -> Trace:
    """Distinct prompts of ``lengths`` tokens, all arriving at ``at``, 4 tokens each."""
    return simulate(core, [
        (at, make_request(f"{tag}{i}", n, 4, fill=chr(ord("a") + i)))
        for i, n in enumerate(lengths)
    ])  # fmt: skip


def first_tokens(trace: Trace, count: int, tag: str = "r") -> list[float]:
    return [trace.first_token(f"{tag}{i}") for i in range(count)]


def test_the_dialects_say_who_prefills_the_first_of_a_burst_alone() -> None:
    assert make_core(cpu_pool("vllm")).config.scheduler.wake_takes_one is True
    assert make_core(cpu_pool("sglang")).config.scheduler.wake_takes_one is False


def test_four_prompts_over_the_budget_get_their_first_tokens_in_fcfs_steps() -> None:
    core, rec = recording_core(cpu_pool())
    trace = burst(core, [330] * 4)
    # step 1: the first prompt alone; then running first (its decode, the chunk left over),
    # then waiting prompts in arrival order until the 512-token budget is spent
    assert rec.steps[:3] == [
        [("r0", 330)],
        [("r0", 1), ("r1", 330), ("r2", 181)],
        [("r0", 1), ("r1", 1), ("r2", 149), ("r3", 330)],
    ]
    t = first_tokens(trace, 4)
    assert t[0] < t[1] < t[2] == t[3]
    assert t[:3] == trace.step_starts[1:4]  # the ends of steps 1, 2, 3 (each next one's start)


def test_short_prompts_that_fit_the_budget_share_the_second_step() -> None:
    core, rec = recording_core(cpu_pool())
    trace = burst(core, [60] * 4)
    assert rec.steps[:2] == [[("r0", 60)], [("r0", 1), ("r1", 60), ("r2", 60), ("r3", 60)]]
    t = first_tokens(trace, 4)
    assert t[0] < t[1] == t[2] == t[3]
    # the first waits one short prefill; the others one short and one three-prompt step
    assert t[1] - t[0] > 2 * (t[0] - core.config.device.overheads.request_s)


def test_every_step_of_eight_prompts_stays_within_the_budget_and_fills_it() -> None:
    core, rec = recording_core(cpu_pool())
    trace = burst(core, [330] * 8)
    sizes = [sum(q for _, q in step) for step in rec.steps]
    assert all(size <= BUDGET for size in sizes)
    last_prefill = max(i for i, step in enumerate(rec.steps) if any(q > 1 for _, q in step))
    # after the lone first prompt, every step until the prompts run out spends the whole budget
    assert sizes[0] == 330 and set(sizes[1:last_prefill]) == {BUDGET}
    assert sum(q for step in rec.steps for _, q in step if q > 1) == 8 * 330
    # admission is first come, first served: each prompt starts no earlier than the one before
    starts = [next(i for i, s in enumerate(rec.steps) if any(r == f"r{k}" for r, _ in s))
              for k in range(8)]
    assert starts == sorted(starts)
    t = first_tokens(trace, 8)
    assert t == sorted(t) and t[0] < t[1] < t[7]


def test_prompts_that_arrive_during_a_step_all_join_the_next() -> None:
    core, rec = recording_core(cpu_pool())
    first = make_request("r0", 60, 4, fill="a")
    later = [make_request(f"r{i}", 60, 4, fill=chr(ord("a") + i)) for i in (1, 2, 3)]
    simulate(core, [(0.0, first), *[(0.01, r) for r in later]])
    assert rec.steps[1] == [("r0", 1), ("r1", 60), ("r2", 60), ("r3", 60)]


def test_an_engine_that_went_idle_again_takes_the_next_burst_one_first() -> None:
    core, rec = recording_core(cpu_pool())
    burst(core, [60, 60], at=0.0, tag="a")
    done = len(rec.steps)
    burst(core, [60, 60, 60], at=10.0, tag="b")
    assert rec.steps[done:done + 2] == [[("b0", 60)], [("b0", 1), ("b1", 60), ("b2", 60)]]


def test_requests_waiting_since_before_the_engine_went_idle_are_not_held_back() -> None:
    core = make_core(cpu_pool())
    sched = core.scheduler
    stuck = [make_request(f"s{i}", 60, 4, fill=chr(ord("a") + i)) for i in range(2)]
    new = [make_request(f"n{i}", 60, 4, fill=chr(ord("p") + i)) for i in range(2)]
    for req, ready in [(stuck[0], 0.5), (stuck[1], 0.5), (new[0], 1.5), (new[1], 1.5)]:
        sched.waiting.append(req)
        req.available_at = ready
    sched.idle_since = 1.0  # idle from 1.0 with the first two already waiting
    batch = sched.schedule(2.0)
    assert [(r.rid, q) for r, q in batch] == [("s0", 60), ("s1", 60), ("n0", 60)]
    assert sched.idle_since is None and [r.rid for r in sched.waiting] == ["n1"]


def test_sglang_prefills_every_available_prompt_in_its_first_step() -> None:
    core, rec = recording_core(cpu_pool("sglang"))
    trace = burst(core, [60] * 4)
    assert rec.steps[0] == [("r0", 60), ("r1", 60), ("r2", 60), ("r3", 60)]
    t = first_tokens(trace, 4)
    assert t[0] == t[1] == t[2] == t[3]
