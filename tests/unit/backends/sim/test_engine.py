"""The engine loop on virtual time: batching, chunked prefill, prefix sharing, preemption,
speculation, SGLang's prefill-first steps."""

from __future__ import annotations

import random
from typing import Any

import pytest

from backends.sim import tokens
from backends.sim.answers import PLAIN, Answer
from backends.sim.engine import EngineCore
from backends.sim.kvcache import reload_seconds
from backends.sim.request import Phase, SimRequest
from backends.sim.speculative import position_rates
from backends.sim.virtual import simulate
from routing.formulas import SeqWork, expected_tokens_per_pass
from tests.unit.backends.sim.sim_helpers import make_core, make_pool, make_request, with_capacity


def _itl_during_long_prefill(chunk: int | None) -> tuple[float, float]:
    """Four streams decoding when an 8k-token prompt arrives: (their worst gap, one chunk step)."""
    pool = make_pool(model="llama-3-8b", hardware="a100-80gb", chunk=chunk)
    core = make_core(pool)
    streams = [(0.0, make_request(f"s{i}", 64, 400)) for i in range(4)]
    trace = simulate(core, [*streams, (0.5, make_request("long", 8000, 1))])
    worst = max(max(trace.gaps(f"s{i}")) for i in range(4))
    return worst, trace.first_token("long") - 0.5


def test_chunked_prefill_bounds_decode_gaps_by_one_chunk() -> None:
    chunked_gap, chunked_ttft = _itl_during_long_prefill(512)
    whole_gap, whole_ttft = _itl_during_long_prefill(None)
    pool = make_pool(model="llama-3-8b", hardware="a100-80gb", chunk=512)
    # one step = a 512-token chunk over up to 8k of context plus the four decodes
    device = make_core(pool).config.device
    one_chunk = device.step_cost([SeqWork(508, 7492)] + [SeqWork(1, 500)] * 4).seconds
    assert chunked_gap <= one_chunk * 1.05
    # the monolithic 8k prefill stalls every stream for the whole prefill
    assert whole_gap >= 0.9 * whole_ttft
    assert whole_gap > 5 * chunked_gap
    # and the long prompt itself pays a little for sharing steps
    assert chunked_ttft > whole_ttft


def test_shared_prefix_saves_about_f_of_the_prefill() -> None:
    pool = make_pool(model="llama-3-8b", hardware="a100-80gb", prefix_caching=True)
    core = make_core(pool)
    system = "S" * (3072 * 4)  # f = 3072 / 4096 = 0.75
    cold = simulate(core, [(0.0, make_request("a", 4096, 1, prefix=system))])
    warm = simulate(core, [(0.0, make_request("b", 4096, 1, prefix=system))])
    overhead = core.config.device.overheads.request_s
    ratio = (warm.first_token("b") - overhead) / (cold.first_token("a") - overhead)
    assert ratio == pytest.approx(1 - 0.75, abs=0.05)
    assert core.stats.prefix_hits == 3072
    assert core.stats.prefix_queries == 2 * 4096


def test_without_prefix_caching_nothing_is_shared() -> None:
    core = make_core(make_pool(prefix_caching=False))
    system = "S" * (3072 * 4)
    simulate(core, [(0.0, make_request("a", 4096, 1, prefix=system))])
    simulate(core, [(0.0, make_request("b", 4096, 1, prefix=system))])
    assert core.stats.prefix_hits == 0
    assert core.stats.prompt_tokens_computed == 2 * 4096


def test_full_cache_preempts_and_every_request_still_finishes() -> None:
    pool = make_pool(model="llama-3-8b", hardware="a100-80gb", prefix_caching=True)
    pool = pool.model_copy(
        update={
            "hardware": pool.hardware.model_copy(update={"kv_cache_bytes": 131_072 * 16 * 40}),
            "model": pool.model.model_copy(update={"max_context": 512}),
        }
    )  # 40 blocks of 16 tokens = 640 tokens
    core = make_core(pool)
    reqs = [make_request(f"r{i}", 100, 120, fill="abcd"[i]) for i in range(4)]  # 4 · 220 > 640
    simulate(core, [(0.0, r) for r in reqs])
    assert core.stats.preemptions > 0
    assert all(r.phase is Phase.FINISHED and r.generated == 120 for r in reqs)
    assert core.pool.num_free == core.pool.num_blocks


def test_a_preempted_requests_readmission_is_no_prefix_cache_query() -> None:
    """vLLM 0.32 counts a re-admission after preemption apart (``preempted=True``): the
    prefix-cache queries are each request's prompt once, however often it was preempted."""
    pool = make_pool(model="llama-3-8b", hardware="a100-80gb", prefix_caching=True)
    pool = pool.model_copy(update={
        "hardware": pool.hardware.model_copy(update={"kv_cache_bytes": 131_072 * 16 * 40}),
        "model": pool.model.model_copy(update={"max_context": 512})})
    core = make_core(pool)
    reqs = [make_request(f"r{i}", 100, 120, fill="abcd"[i]) for i in range(4)]
    simulate(core, [(0.0, r) for r in reqs])
    assert core.stats.preemptions > 0
    assert core.stats.prefix_queries == 4 * 100  # four 100-token prompts, once each


def test_a_preempted_request_names_its_recomputed_blocks_again() -> None:
    """Preemption frees the request's blocks: the ones it recomputes are cached again."""
    core = make_core(make_pool(prefix_caching=True))
    req = make_request("r", 100, 4)
    core.scheduler.running.append(req)
    req.named_blocks, req.num_computed = 6, 100
    core.scheduler.preempt(req)
    assert req.named_blocks == 0 and req.blocks == [] and req.num_computed == 0


def test_speculation_yields_the_expected_tokens_per_verify_step() -> None:
    pool = make_pool(spec_k=4, knobs={"acceptance_rate": 0.8, "draft_cost": 0.0})
    core = make_core(pool, seed=3)
    reqs = [make_request(f"r{i}", 32, 2000) for i in range(8)]
    simulate(core, [(0.0, r) for r in reqs])
    st = core.stats
    # the last pass of each request may be cut short by max_tokens, so compare loosely
    assert st.spec_accept_length() == pytest.approx(expected_tokens_per_pass(0.8, 4), abs=0.08)
    assert all(r.generated == 2000 for r in reqs)
    assert st.generation_tokens == 8 * 2000


def test_speculation_speeds_up_a_lone_memory_bound_stream() -> None:
    plain = make_core(make_pool())
    spec = make_core(make_pool(spec_k=4, knobs={"acceptance_rate": 0.8, "draft_cost": 0.05}))
    t_plain = simulate(plain, [(0.0, make_request("a", 32, 500))]).end
    t_spec = simulate(spec, [(0.0, make_request("a", 32, 500))]).end
    # memory-bound: a verify pass of 5 tokens costs about one decode step, drafting 20 % more
    assert t_plain / t_spec == pytest.approx(3.36 / 1.2, rel=0.15)


def test_sglang_runs_prefill_steps_without_decodes() -> None:
    pool = make_pool(engine="sglang", chunk=512)
    core = make_core(pool)
    trace = simulate(
        core, [(0.0, make_request("s", 64, 300)), (0.2, make_request("long", 6000, 1))]
    )
    arrive = 0.2 + core.config.device.overheads.request_s
    long_done = trace.first_token("long")
    # no token for the decoding stream while the long prompt is prefilled, chunk after chunk
    during = [t for t, _ in trace.tokens["s"] if arrive + 0.02 < t < long_done]
    assert during == []
    assert max(trace.gaps("s")) >= 0.9 * (long_done - arrive)


def test_vllm_mixes_decodes_into_prefill_chunks() -> None:
    core = make_core(make_pool(engine="vllm", chunk=512))
    trace = simulate(
        core, [(0.0, make_request("s", 64, 300)), (0.2, make_request("long", 6000, 1))]
    )
    during = [t for t, _ in trace.tokens["s"] if 0.25 < t < trace.first_token("long")]
    assert len(during) >= 10


def test_abort_frees_the_kv_and_leaves_the_batch() -> None:
    core = make_core(make_pool())
    req = make_request("a", 500, 1000)
    core.add(req)
    now = 0.0
    for _ in range(5):
        now += core.step(now).seconds + core.config.device.overheads.request_s
    assert core.num_running == 1 and core.pool.usage > 0
    core.abort(req, now)
    assert core.num_running == 0 and core.pool.usage == 0
    assert core.stats.finished["abort"] == 1
    assert core.step(now).idle


def test_max_num_seqs_caps_the_running_batch() -> None:
    pool = make_pool()
    core = make_core(pool)
    cap = core.config.scheduler.max_num_seqs
    simulate(core, [(0.0, make_request(f"r{i}", 8, 50)) for i in range(cap + 10)], until=0.05)
    assert core.num_running <= cap and core.num_waiting >= 10


# -- n-gram speculation: acceptance from the text --------------------------------------------

CODE = "\n".join(f"    total_{i} = compute(values[{i}], scale={i % 7}) + offset_{i % 3}"
                 for i in range(40))


def text_request(rid: str, content: str, max_tokens: int) -> SimRequest:
    """A chat request built as the simulated endpoint builds one, its answer included."""
    toks = tokens.stream_tokens(tokens.render_chat([{"role": "user", "content": content}]))
    rng = random.Random(rid)
    return SimRequest(rid=rid, tokens=toks, prompt_tokens=len(toks), max_tokens=max_tokens,
                      finish_reason="length", arrival=0.0, rng=rng,
                      requested_max_tokens=max_tokens,
                      answer=Answer.for_prompt(toks, rng, PLAIN))


def decode_time(pool_kw: dict[str, object], content: str, max_tokens: int) -> tuple[float, object]:
    core = make_core(make_pool(**pool_kw))  # type: ignore[arg-type]
    return simulate(core, [(0.0, text_request("r", content, max_tokens))]).end, core.stats


def test_ngram_speculation_speeds_up_a_copy_and_not_free_chat() -> None:
    ngram = {"spec_k": 4, "spec_method": "ngram", "knobs": {"draft_cost": 0.0}}
    copy = "Repeat this code exactly:\n" + CODE
    chat = "Tell me something about the weather in spring and why it changes so often."
    t_plain, _ = decode_time({}, copy, 300)
    t_copy, st = decode_time(ngram, copy, 300)
    # the answer repeats the prompt: nearly every draft is accepted, ~5 tokens per pass
    assert st.spec_accepted / st.spec_draft_tokens > 0.9  # type: ignore[attr-defined]
    assert t_plain / t_copy > 3.0
    # free text: drafts are rare (an n-gram of the pseudo-words seldom repeats) and mostly
    # rejected, so speculation changes little
    t_plain, _ = decode_time({}, chat, 300)
    t_chat, st = decode_time(ngram, chat, 300)
    assert st.spec_accepted <= 0.2 * max(st.spec_draft_tokens, 1)  # type: ignore[attr-defined]
    assert 0.85 < t_plain / t_chat < 1.25


def test_ngram_drafts_only_where_the_lookup_finds_something() -> None:
    core = make_core(make_pool(spec_k=4, spec_method="ngram"))
    req = text_request("r", "Hello there, how are you today?", 40)
    simulate(core, [(0.0, req)])
    st = core.stats
    # a verify pass is counted only when the look-up proposed drafts
    assert st.spec_drafts < req.generated - 1
    assert st.generation_tokens == 40


def test_draft_model_acceptance_follows_the_position_curve() -> None:
    curve = [0.9, 0.6, 0.5, 0.3]
    pool = make_pool(spec_k=4, knobs={"acceptance_by_position": curve, "draft_cost": 0.0})
    core = make_core(pool, seed=4)
    simulate(core, [(0.0, make_request(f"r{i}", 32, 1500)) for i in range(6)])
    st = core.stats
    seen = [n / st.spec_drafts for n in st.spec_accepted_per_pos]
    # P(draft i accepted) = 0.9, 0.54, 0.27, 0.081 (the last passes may be cut short)
    assert seen == pytest.approx(position_rates(curve, 4), abs=0.03)


# -- capacity levers: a host KV tier, an fp8 KV cache --------------------------------------------

LLAMA_KV = 131_072  # B/token, Llama-3-8B with a 16-bit KV cache


def _evicting(host_gb: float | None, *, link: float = 25e9, **levers: Any
              ) -> tuple[EngineCore, float]:
    """An 8192-token KV cache (512 blocks): prompt A (6000 tokens), then B (8000, other text)
    evicts all of A but its first 12 blocks, then C (6000) shares A's first 5000 tokens.
    Returns the core and C's prefill time [s]."""
    base = make_pool(model="llama-3-8b", hardware="a100-80gb", prefix_caching=True)
    tier = {"host_kv_cache": {"size_gb": host_gb}} if host_gb is not None else {}
    pool = with_capacity(base, kv_cache_bytes=8192 * LLAMA_KV, host_link_bandwidth=link,
                         **tier, **levers)
    core = make_core(pool)
    shared = "A" * (5000 * 4)
    trace = simulate(core, [(0.0, make_request("a", 6000, 1, prefix=shared)),
                            (5.0, make_request("b", 8000, 1, fill="B")),
                            (10.0, make_request("c", 6000, 1, prefix=shared, fill="C"))])
    return core, trace.first_token("c") - 10.0 - core.config.device.overheads.request_s


def test_a_host_tier_reloads_what_the_device_evicted_instead_of_recomputing_it() -> None:
    plain, recompute = _evicting(None)
    hosted, reload = _evicting(64)
    assert plain.stats.prefix_hits == 12 * 16  # B pushed the rest of A out of the device
    # C's shared 5000 tokens (4992 in whole 16-token blocks): 192 on the device, the rest
    # reloaded from the host
    assert hosted.stats.prefix_hits == 4992 and hosted.stats.host_hits == 4800
    assert hosted.stats.prompt_tokens_host == 4800 and hosted.stats.prompt_tokens_cached == 4992
    assert hosted.stats.host_load_bytes == 4800 * LLAMA_KV
    # reloading 629 MB at 25 GB/s (25 ms) instead of a 4800-token prefill (~0.25 s)
    assert reload < 0.35 * recompute


def test_a_reload_lasts_bytes_over_the_host_link() -> None:
    core, prefill = _evicting(64, link=1e9)  # a slow link: the copy outlasts C's compute
    reload = reload_seconds(4800, LLAMA_KV, 1e9)
    assert reload == pytest.approx(0.6291456, rel=1e-9)  # 4800 · 131,072 B ÷ 1 GB/s
    assert prefill == pytest.approx(reload, rel=1e-9)  # max(roofline, reload), reload binds
    assert core.stats.host_load_seconds == pytest.approx(reload)


def test_fp8_kv_doubles_the_tokens_the_same_bytes_hold() -> None:
    core, _ = _evicting(None, kv_cache_dtype="fp8")
    assert core.config.num_blocks == 2 * 512 and core.capacity_tokens == 16_384
    # A's 5000 shared tokens survive B on the doubled cache: C hits them on the device
    assert core.stats.prefix_hits >= 4992 and core.stats.host_hits == 0
