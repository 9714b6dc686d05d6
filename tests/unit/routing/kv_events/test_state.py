"""The state wrapper that matches prefixes against the engines' KV events."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from routing.features import token_block_hashes
from routing.kv_events.events import BlocksRemoved, BlocksStored
from routing.kv_events.index import KvEventIndex
from routing.kv_events.state import EventState, unwrapped
from routing.state.memory import MemoryState, StateLimits
from routing.state.protocol import Ask, RouterState, StateView
from tests.unit.routing.state_contract import (
    A,
    B,
    FakeClock,
    M,
    RouterStateContract,
    StateFactory,
    outcome,
)

IDS = list(range(1, 33))  # 32 tokens: 2 engine blocks of 16, 8 router blocks of 4
HASHES = token_block_hashes(IDS, 4, M)


class TestEventStateFollowingNothing(RouterStateContract):
    """Wrapping a state and following no endpoint changes nothing the contract checks."""

    @pytest.fixture
    async def make_state(self, clock: FakeClock) -> AsyncIterator[StateFactory]:
        made: list[RouterState] = []

        async def make(limits: StateLimits) -> RouterState:
            state = EventState(MemoryState(limits, clock=clock), KvEventIndex(4, 1000))
            made.append(state)
            return state

        yield make
        for state in made:
            await state.aclose()


def stored(count: int) -> BlocksStored:
    names = [b"e1", b"e2"][:count]
    return BlocksStored(names, None, IDS[:16 * count], 16, "GPU")


class Pick:
    def __init__(self, url: str) -> None:
        self.urls = (url,)


def make(clock: FakeClock) -> tuple[EventState, MemoryState, KvEventIndex]:
    inner, index = MemoryState(StateLimits(), clock=clock), KvEventIndex(4, 1000, 30.0, clock)
    index.follow(A, [M])
    return EventState(inner, index), inner, index


def ask(urls: tuple[str, ...] = (A, B)) -> Ask:
    return Ask(M, HASHES, None, urls, 10)


async def test_followed_endpoints_match_what_the_engine_reports() -> None:
    state, inner, index = make(FakeClock())
    inner.record_blocks(A, HASHES)  # the approximate index says A holds everything
    inner.record_blocks(B, HASHES[:3])
    view = await state.read(ask())
    assert view.matched_blocks == {B: 3}  # A reported nothing: no match there
    assert view.exact_endpoints == frozenset({A})
    assert view.sent_blocks == {A: len(HASHES), B: 3}  # what was sent, for the session's home
    index.apply(A, [stored(1)])
    assert (await state.read(ask())).matched_blocks == {A: 4, B: 3}
    index.apply(A, [BlocksRemoved([b"e1"], "GPU")])
    assert (await state.read(ask())).matched_blocks == {B: 3}
    assert unwrapped(state) is inner and unwrapped(inner) is inner


async def test_placing_and_finishing_a_request_keeps_its_blocks_pending_meanwhile() -> None:
    state, _, index = make(FakeClock())
    index.apply(A, [stored(1)])
    seen: list[StateView] = []

    def choose(view: StateView) -> Pick:
        seen.append(view)
        return Pick(A)

    placed = await state.place(ask(), choose)
    assert placed is not None
    assert seen[0].matched_blocks == {A: 4} and placed.view is seen[0]
    assert (await state.read(ask())).matched_blocks == {A: 8}  # in flight there
    await state.finish(placed.reservations[0], outcome(HASHES, prompt=32, matched=16))
    assert (await state.read(ask())).matched_blocks == {A: 4}  # the engine kept block 1 only
    assert state.in_flight() == {}


async def test_nothing_chosen_reserves_nothing() -> None:
    state, _, _ = make(FakeClock())
    assert await state.place(ask(), lambda view: None) is None
    assert (await state.read(ask())).matched_blocks == {}


async def test_held_blocks_are_the_engines_where_they_report() -> None:
    state, inner, index = make(FakeClock())
    inner.record_blocks(A, HASHES)
    inner.record_blocks(B, HASHES[:3])
    index.apply(A, [stored(1)])
    assert state.held_blocks() == {A: 4, B: 3}
    assert state.measures().window == inner.measures().window
    assert state.learned_output(M) is None


async def test_a_match_in_the_host_tier_carries_its_reload_cost() -> None:
    state, _, index = make(FakeClock())
    index.follow(A, [M], reload_ratio=0.5)
    index.apply(A, [stored(2), BlocksStored([b"e1", b"e2"], None, [], 0, "CPU"),
                    BlocksRemoved([b"e2"], "GPU")])
    view = await state.read(ask())
    assert view.matched_blocks == {A: 8} and view.reload_tokens == {A: 4 * 4 * 0.5}
