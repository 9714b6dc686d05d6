"""The precise-routing traffic: shared system prompts, growing sessions, within the context."""

from __future__ import annotations

import pytest

from ridge_bench.harness.workloads import AGENT, full_messages, placeholder_reply
from ridge_bench.precise.workload import SYSTEMS, shared_prefix_workload

CONTEXT = 2048
REAL_PER_ESTIMATED = 1.5  # SmolLM2's tokenizer counts this text at ~1.4 × the estimate


def test_it_is_fixed_by_the_seed() -> None:
    one, two = (shared_prefix_workload(3, 0.5, 60.0) for _ in range(2))
    assert one.arrivals(20) == two.arrivals(20)
    assert one.sources[AGENT].conversation(7) == two.sources[AGENT].conversation(7)
    assert shared_prefix_workload(4, 0.5, 60.0).sources[AGENT].conversation(7) != \
        one.sources[AGENT].conversation(7)


def test_sessions_share_a_few_system_prompts_and_grow_within_the_context() -> None:
    source = shared_prefix_workload(0, 0.5, 60.0).sources[AGENT]
    systems, longest = set(), 0
    for i in range(40):
        conv = source.conversation(i)
        systems.add(conv.prefix[0]["content"])
        assert 3 <= len(conv.turns) <= 5
        replies: list[str] = []
        for k, turn in enumerate(conv.turns):
            chars = sum(len(m["content"]) for m in full_messages(conv, k, replies))
            longest = max(longest, chars // 4 + turn.max_tokens)
            replies.append(placeholder_reply(conv.key, k, turn.max_tokens))
    assert len(systems) == SYSTEMS
    assert longest * REAL_PER_ESTIMATED < CONTEXT


def test_one_rate_for_the_whole_run() -> None:
    workload = shared_prefix_workload(0, 0.4, 180.0)
    assert [(s.rate, s.duration_s) for s in workload.steps] == [(0.4, 180.0)]
    assert all(a.at_s < 180.0 and a.kind == AGENT for a in workload.arrivals(1000))


@pytest.mark.parametrize(("rate", "duration"), [(0.0, 10.0), (1.0, 0.0)])
def test_a_rate_and_duration_must_be_positive(rate: float, duration: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        shared_prefix_workload(0, rate, duration)
