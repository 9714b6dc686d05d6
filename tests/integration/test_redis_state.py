"""The router-state contract against a REAL redis-server, and Redis failing as routine.

The very tests of :class:`tests.unit.routing.state_contract.RouterStateContract` run against
:class:`gateway.redis_state.RedisState` (each state under its own key prefix, the database
flushed after each test); the fake clock is passed into the Lua script as the time. Then what
only a shared state has: two states (two gateways) over one Redis see one memory and do not
herd; with Redis killed every call is served locally, the backend gauge callback drops to
False once, and the state goes back to Redis by itself when a server answers again.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from gateway.redis_state import RedisState
from routing.memory_state import StateLimits
from routing.select import Candidate, Group
from routing.state import LoadCounts, RouterState
from tests.integration.redis_server import RedisServer, running_redis
from tests.unit.routing.state_contract import (
    CANDIDATES,
    SHARED,
    A,
    B,
    C,
    D,
    FakeClock,
    RouterStateContract,
    StateFactory,
    chain,
    loads,
    outcome,
    select_request,
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
        held = await two.reserve(B, 7)
        view = await two.read("m", chain(SHARED), "s", (A, B))
        assert dict(view.matched_blocks) == {A: 10} and view.session_endpoint == A
        assert await loads(one, A, B) == {A: LoadCounts(), B: LoadCounts(1, 7)}
        await one.finish(held, outcome())  # any gateway may release
        assert await loads(two, B) == {B: LoadCounts()}
    finally:
        await one.aclose()
        await two.aclose()


async def test_gateways_selecting_at_once_do_not_herd(redis_server: RedisServer) -> None:
    states = [new_state(redis_server, StateLimits(), prefix="herd:") for _ in range(4)]
    request = select_request(chain(SHARED), [Group(CANDIDATES + (Candidate(D),))])
    try:
        chosen = await asyncio.gather(*(states[i % 4].select_and_reserve(request)
                                        for i in range(64)))
        counts = {url: 0 for url in (A, B, C, D)}
        for selection in chosen:
            counts[selection.endpoints[0]] += 1
        assert counts == {A: 16, B: 16, C: 16, D: 16}
    finally:
        for state in states:
            await state.aclose()


async def test_redis_down_is_served_locally_and_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    flips: list[bool] = []
    with running_redis() as server:
        state = new_state(server, StateLimits(), on_backend=flips.append, probe_interval_s=0.05)
        try:
            shared = await state.reserve(A, 5)
            server.stop()
            with caplog.at_level(logging.WARNING, "ridge.state"):
                local = await state.reserve(B, 3)  # fails over: no exception
                chosen = await state.select_and_reserve(
                    select_request(chain(SHARED), [Group(CANDIDATES)]))
                await state.finish(shared, outcome(chain(SHARED)))
            assert not state.up and flips == [True, False]
            assert chosen.endpoints == (A,)  # the local count knows B is busy, A not
            assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
            server.start()
            await asyncio.wait_for(_until_up(state), 10.0)
            assert flips == [True, False, True]
            # the shared reservation released while Redis was down was released on return
            assert await loads(state, A) == {A: LoadCounts()}
            await state.finish(local, outcome())
            await state.finish(chosen.reservations[0], outcome())
            assert state.local.sizes().reservations == 0
        finally:
            await state.aclose()


async def test_a_state_started_without_redis_runs_locally() -> None:
    server = RedisServer()  # never started: nothing listens on its port
    flips: list[bool] = []
    state = new_state(server, StateLimits(), on_backend=flips.append, probe_interval_s=0.05)
    try:
        await state.start()
        held = await state.reserve(A, 4)
        assert (await loads(state, A)) == {A: LoadCounts(1, 4)}
        await state.finish(held, outcome())
        assert flips == [True, False] and not state.up
    finally:
        await state.aclose()
        server.close()


async def _until_up(state: RedisState) -> None:
    while not state.up:
        await asyncio.sleep(0.02)
