"""ridge_bench.replay.sessions: the long multi-turn trace's shape, and the shipped file."""

from __future__ import annotations

import json
from statistics import mean

from ridge_bench.replay.bounds import lru_bound, unlimited_bound
from ridge_bench.replay.sessions import LONG_SESSIONS, SessionShape, session_trace
from ridge_bench.replay.trace import TRACES_DIR, load_trace


def test_follow_ups_extend_their_parent_and_sessions_come_back_after_minutes() -> None:
    shape = SessionShape(session_rate=0.5, span_s=120.0)
    records = session_trace(3, shape)
    assert records == session_trace(3, shape) and records != session_trace(4, shape)
    sessions: dict[int, list[dict[str, object]]] = {}
    for r in records:  # a session is known by its first own block (after the system prompt)
        ids = r["hash_ids"]
        assert isinstance(ids, list)
        sessions.setdefault(ids[shape.system_blocks], []).append(r)
    gaps = []
    for turns in sessions.values():
        for parent, child in zip(turns, turns[1:], strict=False):
            p_ids, c_ids = parent["hash_ids"], child["hash_ids"]
            assert isinstance(p_ids, list) and isinstance(c_ids, list)
            assert c_ids[:len(p_ids)] == p_ids  # the follow-up repeats the parent's prompt
            assert isinstance(child["timestamp"], int) and isinstance(parent["timestamp"], int)
            gaps.append((child["timestamp"] - parent["timestamp"]) / 1000)
    assert min(gaps) >= shape.quick_think_s[0] - 1e-3
    assert any(g >= shape.away_s[0] for g in gaps)  # some come back minutes later


def test_shipped_long_trace_is_the_generators() -> None:
    path = TRACES_DIR / "long-sessions.jsonl"
    assert [json.loads(line) for line in path.read_text().splitlines()] == \
        session_trace(0, LONG_SESSIONS)
    entries = load_trace(path)
    assert len(entries) == 2570
    assert 12_000 <= mean(e.input_length for e in entries) <= 15_000
    unlimited = unlimited_bound(entries)
    assert 0.78 <= unlimited <= 0.85
    assert lru_bound(entries, 8 * 207_061) < 0.75 * unlimited  # the plain fleet's KV binds
