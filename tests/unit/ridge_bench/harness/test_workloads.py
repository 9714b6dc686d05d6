"""Workloads: deterministic for a seed, bounded, and shaped as documented (sizes, f)."""

from __future__ import annotations

import json
import re

import pytest

from ridge_bench.harness import workloads as w
from ridge_bench.harness.prefix import canonical_text, prompt_tokens


def _first(source: w.Source, n: int) -> list[w.Conversation]:
    return [source.conversation(i) for i in range(n)]


@pytest.mark.parametrize("name", w.NAMES)
def test_same_seed_same_workload_other_seed_other(name: str) -> None:
    a, b, c = (w.build(name, seed, 5.0, 60.0) for seed in (7, 7, 8))
    assert a.arrivals(100) == b.arrivals(100)
    assert a.arrivals(100) != c.arrivals(100)
    for kind in a.sources:
        assert _first(a.sources[kind], 5) == _first(b.sources[kind], 5)
        assert _first(a.sources[kind], 5) != _first(c.sources[kind], 5)


def test_a_conversation_does_not_depend_on_the_others() -> None:
    source = w.agent_source(3)
    assert source.conversation(17) == w.agent_source(3).conversation(17)
    assert source.conversation(17) != source.conversation(16)


def test_arrivals_are_bounded_by_count_and_duration() -> None:
    wl = w.build(w.AGENT, 0, 10.0, 30.0)
    assert len(wl.arrivals(50)) == 50
    everything = wl.arrivals(10_000)
    assert everything[-1].at_s < 30.0
    assert all(a.at_s < b.at_s for a, b in zip(everything, everything[1:], strict=False))


def test_poisson_arrivals_keep_the_rate() -> None:
    arrivals = w.build(w.CHAT, 1, 10.0, 1000.0).arrivals(100_000)
    assert 9_500 <= len(arrivals) <= 10_500  # 10 req/s for 1000 s; sd ≈ 100


def test_chat_ramp_is_chat_in_rising_steps() -> None:
    wl = w.build(w.CHAT_RAMP, 0, 9.0, 90.0, steps=3)
    assert [s.rate for s in wl.steps] == [3.0, 6.0, 9.0]
    assert set(wl.sources) == {w.CHAT} and {a.kind for a in wl.arrivals(1000)} == {w.CHAT}
    assert _first(wl.sources[w.CHAT], 3) == _first(w.build(w.CHAT, 0, 1.0, 9.0).sources[w.CHAT], 3)


def test_mixed_steps_go_light_to_heavy_and_mix_the_kinds() -> None:
    wl = w.build(w.MIXED, 0, 9.0, 300.0, steps=3)
    assert [s.rate for s in wl.steps] == [3.0, 6.0, 9.0]
    assert [s.duration_s for s in wl.steps] == [100.0, 100.0, 100.0]
    arrivals = wl.arrivals(100_000)
    per_step = [sum(a.step == i for a in arrivals) for i in range(3)]
    assert per_step[0] < per_step[1] < per_step[2]
    assert all(100 * i <= a.at_s < 100 * (i + 1) for a in arrivals for i in [a.step])
    for i in range(3):
        kinds = [a.kind for a in arrivals if a.step == i]
        for kind, weight in w.MIXED_WEIGHTS.items():
            assert abs(kinds.count(kind) - weight * len(kinds)) <= 1  # the same mix per step


def test_kind_sequence_is_smooth_weighted_round_robin() -> None:
    seq = w.kind_sequence({"a": 0.5, "r": 0.3, "c": 0.2})
    first = [next(seq) for _ in range(10)]
    # credits (a, r, c) before each pick: (.5,.3,.2) a; (0,.6,.4) r; (.5,-.1,.6) c;
    # (1,.2,-.2) a; (.5,.5,0) a (tie: first listed); (0,.8,.2) r; (.5,.1,.4) a; (0,.4,.6) c;
    # (.5,.7,-.2) r; (1,0,0) a
    assert first == ["a", "r", "c", "a", "a", "r", "a", "c", "r", "a"]


def test_agent_system_prompts_are_long_and_carry_json_tool_schemas() -> None:
    source = w.agent_source(0)
    assert 3 <= len(source.systems) <= 4
    for system in source.systems:
        assert prompt_tokens(system) >= 1500
        tools = json.loads(system[system.index("\n[") + 1:])
        assert tools and all(t["type"] == "function" for t in tools)
    assert len(set(source.systems)) == len(source.systems)


def test_agent_conversations_are_multi_turn_with_tool_results() -> None:
    convs = _first(w.agent_source(0), 40)
    assert all(3 <= len(c.turns) <= 6 for c in convs)
    assert {c.prefix[0]["content"] for c in convs} == set(w.agent_source(0).systems)
    later = [t.content for c in convs for t in c.turns[1:]]
    assert all(re.match(r"Tool result \(call \d+\): \{", t) for t in later)


def test_full_messages_append_the_real_replies() -> None:
    conv = w.agent_source(0).conversation(0)
    msgs = w.full_messages(conv, 2, ["first reply", "second reply"])
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant",
                                         "user"]
    assert msgs[2]["content"] == "first reply" and msgs[4]["content"] == "second reply"
    assert msgs[5]["content"] == conv.turns[2].content


def test_agent_prefix_share_is_about_0_8() -> None:
    f = w.theoretical_f(w.build(w.AGENT, 0, 5.0, 60.0))
    assert 0.75 <= f <= 0.85


def test_rag_asks_each_long_document_several_times() -> None:
    source = w.RagSource(0)
    convs = _first(source, 2 * source.window * source.questions)
    docs = [source.document_of(i) for i in range(len(convs))]
    assert all(docs.count(d) == source.questions for d in set(docs))
    assert len(set(docs)) == 2 * source.window
    for conv in convs:
        context = conv.turns[0].content.split("\n\nQuestion")[0]
        assert prompt_tokens(context) >= 2000
    same = [c.turns[0].content.split("Question")[0] for c, d in zip(convs, docs, strict=True)
            if d == docs[0]]
    assert len(set(same)) == 1  # the same document text, so the same prefix


def test_chat_prompts_are_short_unique_and_ask_for_long_answers() -> None:
    convs = _first(w.ChatSource(0), 200)
    assert all(256 <= c.turns[0].max_tokens <= 512 for c in convs)
    assert all(prompt_tokens(c.turns[0].content) <= 200 for c in convs)
    assert w.theoretical_f(w.build(w.CHAT, 0, 1.0, 60.0)) < 0.05


def test_mixed_f_weights_the_kinds_by_arrival_share() -> None:
    mixed = w.theoretical_f(w.build(w.MIXED, 0, 5.0, 60.0))
    agent = w.theoretical_f(w.build(w.AGENT, 0, 5.0, 60.0))
    rag = w.theoretical_f(w.build(w.RAG, 0, 5.0, 60.0))
    assert min(agent, rag) * 0.9 < mixed < max(agent, rag)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown workload"):
        w.build("batch", 0, 1.0, 1.0)
    with pytest.raises(ValueError):
        w.build(w.AGENT, 0, 0.0, 1.0)


def test_rag_questions_are_shuffled_not_a_fixed_rotation() -> None:
    source = w.RagSource(0)
    n = source.window * source.questions
    docs = [source.document_of(i) for i in range(n)]
    # a rotation (doc = i % window) would send each document to the same replicas under a
    # round-robin router over a multiple of ``window`` replicas
    assert docs != [i % source.window for i in range(n)]
    assert any(docs[i] == docs[i + 1] for i in range(n - 1))


@pytest.mark.parametrize("source", [w.agent_source(0), w.RagSource(0), w.ChatSource(0)],
                         ids=lambda s: s.kind)
def test_every_request_fits_an_8k_context(source: w.Source) -> None:
    """Llama-3-8B serves 8,192 tokens; leave 10 % for chat-template and tokeniser slack."""
    for i in range(150):
        conv = source.conversation(i)
        replies = [w.placeholder_reply(conv.key, k, t.max_tokens) for k, t in enumerate(conv.turns)]
        last = len(conv.turns) - 1
        prompt = prompt_tokens(canonical_text(w.full_messages(conv, last, replies)))
        assert prompt + conv.turns[last].max_tokens <= 0.9 * 8192
