"""The Redis state's answers as views, and the pending overlay (the rest of the contract runs
against a real redis-server in tests/integration/test_redis_state.py)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from redis.asyncio import Redis

from gateway.redis_state import RedisState, output_mean, view_of
from routing.load import LoadCounts
from routing.state import StateView


def test_a_read_answer_is_a_view() -> None:
    raw: dict[str, Any] = {"m": {"http://a": 3}, "l": {"http://a": [2, 700]},
                           "w": [1000, 250, 300, 4], "s": "http://a"}
    assert view_of(raw) == StateView({"http://a": 3}, {"http://a": LoadCounts(2, 700)}, 0.25,
                                     "http://a")
    assert output_mean(raw) == 75.0


def test_empty_tables_from_cjson_and_no_window_mean_unknown() -> None:
    raw: dict[str, Any] = {"m": [], "l": [], "w": [0, 0, 0, 0], "s": False}
    assert view_of(raw) == StateView()
    assert output_mean(raw) is None


async def test_the_choice_sees_this_gateways_reservations_still_on_their_way() -> None:
    state = RedisState(Redis())  # never connected: only the overlay is exercised
    view = StateView(load={"http://a": LoadCounts(1, 10)})
    assert state._with_pending(view) is view
    state._pending = Counter({"http://a": 2, "http://b": 1})
    seen = state._with_pending(view)
    assert seen.load_of("http://a") == LoadCounts(3, 10)
    assert seen.load_of("http://b") == LoadCounts(1, 0)
    await state.aclose()


class Script:
    """Stands in for the registered Lua script: answers as ``plan`` says, one item a call."""

    def __init__(self, plan: list[str]) -> None:
        self.plan = plan

    async def __call__(self, args: list[str]) -> str:
        step = self.plan.pop(0)
        if step == "slow":
            raise TimeoutError
        if step == "refused":
            raise ConnectionRefusedError("connection refused")
        return '{"ok": true}'


async def test_slow_answers_in_a_row_are_an_outage_and_one_alone_is_not() -> None:
    seen: list[bool] = []
    state = RedisState(Redis(), on_backend=seen.append, probe_interval_s=3600)
    state._script = Script(["slow", "slow", "ok", "slow", "slow", "slow"])  # type: ignore[assignment]
    answers = [await state._call({"op": "read"}) for _ in range(5)]
    assert answers == [None, None, {"ok": True}, None, None] and seen == [True]  # still up
    assert await state._call({"op": "read"}) is None and seen == [True, False]  # the third
    assert await state._call({"op": "read"}) is None  # down: not even tried
    await state.aclose()


async def test_an_error_is_an_outage_at_once() -> None:
    seen: list[bool] = []
    state = RedisState(Redis(), on_backend=seen.append, probe_interval_s=3600)
    state._script = Script(["refused"])  # type: ignore[assignment]
    assert await state._call({"op": "read"}) is None and seen == [True, False]
    await state.aclose()
