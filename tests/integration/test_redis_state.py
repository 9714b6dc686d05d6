"""The router-state contract against a REAL redis-server, and Redis failing as routine.

The very tests of :class:`tests.unit.routing.state_contract.RouterStateContract` run against
:class:`gateway.state.redis.RedisState` (each state under its own key prefix, the database
flushed after each test); the fake clock is passed into the Lua script as the time. Then what
only a shared state has: two states (two gateways) over one Redis see one memory and do not
herd (the conditional reservation refuses an endpoint another gateway took after the read,
and the router chooses again); with Redis killed every call is served locally, the backend
gauge callback drops to False once, and the state goes back to Redis by itself when a server
answers again.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest
from redis.asyncio import Redis

from gateway.state.redis import ATTEMPTS, RedisState
from routing.load import LoadCounts
from routing.state.memory import StateLimits
from routing.state.protocol import RouterState, StateView
from tests.integration.redis_server import RedisServer, running_redis
from tests.unit.routing.state_contract import (
    SHARED,
    A,
    B,
    C,
    D,
    FakeClock,
    Fixed,
    RouterStateContract,
    StateFactory,
    ask,
    chain,
    loads,
    outcome,
    read,
    reserve,
    scheduled,
    serve,
)


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


def new_state(server: RedisServer, limits: StateLimits, clock: FakeClock | None = None,
              prefix: str | None = None, **kwargs: object) -> RedisState:
    return RedisState.from_url(server.url, limits, prefix=prefix or f"t{uuid.uuid4().hex[:8]}:",
                               timeout_s=1.0, **({"clock": clock} if clock else {}),
                               **kwargs)  # type: ignore[arg-type]


class TestRedisState(RouterStateContract):
    # 40 places at once through one gateway: a choice made on a view that missed a
    # reservation answered meanwhile is still accepted when every endpoint gained as much
    # (the refusal rule), so a burst can end one request off its fair share (11/10/9/10)
    SPREAD_SLACK = 1

    @pytest.fixture
    async def make_state(self, redis_server: RedisServer,
                         clock: FakeClock) -> AsyncIterator[StateFactory]:
        made: list[RedisState] = []

        async def make(limits: StateLimits) -> RouterState:
            state = new_state(redis_server, limits, clock)
            made.append(state)
            return state

        yield make
        for state in made:
            assert state.up, "a contract test fell back to local state: Redis was not used"
            await state.aclose()
        client = Redis.from_url(redis_server.url)
        await client.flushdb()
        await client.aclose()


async def test_two_gateways_share_one_memory(redis_server: RedisServer) -> None:
    clock = FakeClock()
    one, two = (new_state(redis_server, StateLimits(), clock, prefix="shared:")
                for _ in range(2))
    try:
        await serve(one, A, outcome(chain(SHARED), session="s"))
        held = await reserve(two, B, 7)
        view = await read(two, chain(SHARED), "s", (A, B))
        assert dict(view.matched_blocks) == {A: 10} and view.session_endpoint == A
        assert await loads(one, A, B) == {A: LoadCounts(), B: LoadCounts(1, 7)}
        await one.finish(held, outcome())  # any gateway may release
        assert await loads(two, B) == {B: LoadCounts()}
    finally:
        await one.aclose()
        await two.aclose()


async def test_gateways_placing_at_once_do_not_herd(redis_server: RedisServer) -> None:
    """64 requests at one instant through 4 gateways, 16 each, over 4 idle endpoints: no
    herding (a gateway's own choices still on their way count in its view; other gateways'
    reservations landing in between make a reservation refused and the request chosen again
    on the fresher view). Measured over 40 runs: every endpoint within 2 of its fair 16 in 37,
    the worst 14/14/16/20 (a request reaching the forced last attempt); herding would put a
    gateway's 16 on one endpoint. The bound, 16 ± 6, tells the two apart without failing on
    the races the protocol allows."""
    states = [new_state(redis_server, StateLimits(), prefix="herd:") for _ in range(4)]
    choose = scheduled({"cache_aware": 1.0}, (A, B, C, D))  # no prefix: least load
    try:
        chosen = await asyncio.gather(*(states[i % 4].place(ask(urls=(A, B, C, D)), choose)
                                        for i in range(64)))
        counts = {url: 0 for url in (A, B, C, D)}
        for placed in chosen:
            assert placed is not None
            counts[placed.choice.urls[0]] += 1
        assert all(10 <= n <= 22 for n in counts.values()), counts
    finally:
        for state in states:
            await state.aclose()


def race_before_reserving(one: RedisState, two: RedisState, times: int) -> list[str]:
    """Make ``two`` reserve the endpoint ``one`` is about to reserve, just before ``one``'s
    conditional reservation reaches Redis, ``times`` times; the URLs raced are returned."""
    raced: list[str] = []
    call = one._call

    async def racing(args: dict[str, Any], rids: Sequence[str] = ()) -> dict[str, Any] | None:
        if args["op"] == "reserve" and len(raced) < times:
            raced.append(args["picks"][0])
            await reserve(two, args["picks"][0], 1)
        return await call(args, rids)

    one._call = racing  # type: ignore[method-assign]
    return raced


async def test_a_reservation_refused_after_the_read_is_chosen_again(
    redis_server: RedisServer,
) -> None:
    """Another gateway takes the endpoint between this gateway's read and its reservation:
    the reservation is refused and the router chooses again on the fresh view."""
    one, two = (new_state(redis_server, StateLimits(), prefix="race:") for _ in range(2))
    seen: list[StateView] = []
    raced = race_before_reserving(one, two, times=1)
    try:
        placed = await one.place(ask(urls=(A, B)), scheduled({"least_load": 1.0}, (A, B),
                                                              seen=seen))
        assert raced == [A] and len(seen) == 2 and placed is not None
        assert seen[0].load_of(A).requests == 0 and seen[1].load_of(A).requests == 1
        assert placed.choice.urls == (B,)  # A was taken after the first read
        assert placed.view == seen[1]
        assert await loads(one, A, B) == {A: LoadCounts(1, 1), B: LoadCounts(1, 1)}
    finally:
        await one.aclose()
        await two.aclose()


async def test_the_last_attempt_reserves_whatever_the_others_did(
    redis_server: RedisServer,
) -> None:
    one, two = (new_state(redis_server, StateLimits(), prefix="force:") for _ in range(2))
    raced = race_before_reserving(one, two, times=ATTEMPTS)
    calls: list[StateView] = []

    def choose(view: StateView) -> Fixed:
        calls.append(view)
        return Fixed((A,))

    try:
        placed = await one.place(ask(urls=(A, B)), choose)
        assert placed is not None and placed.choice.urls == (A,)
        assert len(calls) == len(raced) == ATTEMPTS
        assert [v.load_of(A).requests for v in calls] == list(range(ATTEMPTS))
        assert (await loads(one, A))[A].requests == 1 + ATTEMPTS
    finally:
        await one.aclose()
        await two.aclose()


async def test_redis_down_is_served_locally_and_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    flips: list[bool] = []
    with running_redis() as server:
        state = new_state(server, StateLimits(), on_backend=flips.append, probe_interval_s=0.05)
        try:
            shared = await reserve(state, A, 5)
            server.stop()
            with caplog.at_level(logging.WARNING, "ridge.state"):
                local = await reserve(state, B, 3)  # fails over: no exception
                chosen = await state.place(ask(chain(SHARED)),
                                           scheduled({"cache_aware": 1.0}, (A, B, C)))
                await state.finish(shared, outcome(chain(SHARED)))
            assert not state.up and flips == [True, False]
            # the local mirror counts this gateway's own requests: A and B are busy, C not
            assert chosen is not None and chosen.choice.urls == (C,)
            assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
            server.start()
            await asyncio.wait_for(_until_up(state), 10.0)
            assert flips == [True, False, True]
            # the shared reservation released while Redis was down was released on return
            assert await loads(state, A) == {A: LoadCounts()}
            await state.finish(local, outcome())
            await state.finish(chosen.reservations[0], outcome())
            assert state.in_flight() == {}
            assert state.local.sizes().reservations == 0
        finally:
            await state.aclose()


async def test_a_restarted_server_is_one_outage_whatever_the_pool_held(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The pool's connections from before a restart are not reused after it: each would fail
    its first call and start an outage of its own."""
    with running_redis() as server:
        state = new_state(server, StateLimits(), probe_interval_s=0.05)
        try:
            held = await asyncio.gather(*(reserve(state, A, 1) for _ in range(8)))  # 8 open
            with caplog.at_level(logging.WARNING, "ridge.state"):
                server.stop()
                server.start()
                await reserve(state, B, 1)  # sees the outage, or already the new server
                await asyncio.wait_for(_until_up(state), 10.0)
                await asyncio.gather(*(state.finish(r, outcome()) for r in held))
                await asyncio.gather(*(reserve(state, C, 1) for _ in range(8)))
            assert state.up
            warnings = [r.getMessage() for r in caplog.records]
            assert sum("Redis unavailable" in w for w in warnings) <= 1, warnings
            assert sum("Redis answers again" in w for w in warnings) <= 1, warnings
        finally:
            await state.aclose()


async def test_a_state_started_without_redis_runs_locally() -> None:
    server = RedisServer()  # never started: nothing listens on its port
    flips: list[bool] = []
    state = new_state(server, StateLimits(), on_backend=flips.append, probe_interval_s=0.05)
    try:
        await state.start()
        held = await reserve(state, A, 4)
        assert (await loads(state, A)) == {A: LoadCounts(1, 4)}
        assert state.in_flight() == {A: LoadCounts(1, 4)}
        await state.finish(held, outcome())
        assert flips == [True, False] and not state.up
    finally:
        await state.aclose()
        server.close()


async def _until_up(state: RedisState) -> None:
    while not state.up:
        await asyncio.sleep(0.02)
