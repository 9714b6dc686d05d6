"""The workers' shared router state: the contract suite for one worker, then what several
workers sharing one region must see of each other."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway.state.shared_memory import ATTEMPTS, SharedRegion, WorkerState
from routing.load import LoadCounts
from routing.state.memory import StateLimits
from routing.state.protocol import RouterState, StateView
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

ENDPOINTS = (A, B, C, D, "http://x", "http://y")


def region(tmp_path: Path, workers: int = 2, log_bytes: int = 1 << 20) -> SharedRegion:
    return SharedRegion(ENDPOINTS, workers, str(tmp_path / "lock"), log_bytes)


class TestOneWorker(RouterStateContract):
    @pytest.fixture
    async def make_state(self, clock: FakeClock, tmp_path: Path) -> AsyncIterator[StateFactory]:
        made: list[WorkerState] = []

        async def make(limits: StateLimits) -> RouterState:
            state = WorkerState(region(tmp_path, 1), 0, limits, clock)
            made.append(state)
            return state

        yield make
        for state in made:
            await state.aclose()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[WorkerState, WorkerState, FakeClock]]:
    clock, shared = FakeClock(), region(tmp_path)
    yield WorkerState(shared, 0, clock=clock), WorkerState(shared, 1, clock=clock), clock


async def test_a_prompt_placed_by_one_worker_is_matched_on_the_other(
    pair: tuple[WorkerState, WorkerState, FakeClock],
) -> None:
    one, two, _ = pair
    held = await reserve(one, B, 5, chain(SHARED))
    assert dict((await read(two, chain(SHARED))).matched_blocks) == {B: 10}
    placed = await two.place(ask(chain(SHARED)), scheduled({"cache_aware": 1.0},
                                                           hashes=chain(SHARED),
                                                           prompt_tokens=20))
    assert placed is not None and placed.choice.urls == (B,)  # where the whole prompt is
    await one.finish(held, outcome(chain(SHARED)))
    await two.finish(placed.reservations[0], outcome(chain(SHARED)))


async def test_a_prompt_placed_by_one_worker_counts_in_the_others_footprint(
    pair: tuple[WorkerState, WorkerState, FakeClock],
) -> None:
    one, two, _ = pair
    held = await reserve(one, B, 5, chain(SHARED))
    seen = await read(two, chain(SHARED))
    footprint, recent = seen.footprint, seen.recent_requests
    assert footprint is not None and (footprint(A), footprint(B)) == (0, 10)
    assert recent is not None and (recent(A), recent(B)) == (0, 1)
    await one.finish(held, outcome(chain(SHARED)))
    after = (await read(two, chain(SHARED))).recent_requests  # applies the finish record
    assert after is not None and after(B) == 1  # a request finishing is not a second one


async def test_loads_are_shared_and_each_worker_reports_its_own(
    pair: tuple[WorkerState, WorkerState, FakeClock],
) -> None:
    one, two, _ = pair
    a = await reserve(one, A, 10)
    b = await reserve(two, A, 7)
    assert await loads(one, A) == {A: LoadCounts(2, 17)} == await loads(two, A)
    assert one.in_flight() == {A: LoadCounts(1, 10)} and two.in_flight() == {A: LoadCounts(1, 7)}
    assert two.measures().in_flight == {A: LoadCounts(2, 17)}
    await two.finish(a, outcome())  # another worker's reservation: not held here
    assert await loads(one, A) == {A: LoadCounts(2, 17)}
    await one.finish(a, outcome())
    await two.finish(b, outcome())
    assert await loads(one, A) == {A: LoadCounts()}


async def test_a_burst_through_both_workers_spreads_like_one_gateway(
    pair: tuple[WorkerState, WorkerState, FakeClock],
) -> None:
    one, two, _ = pair
    choose = scheduled({"cache_aware": 1.0}, (A, B, C, D))
    counts = dict.fromkeys((A, B, C, D), 0)
    for i in range(40):
        placed = await (one, two)[i % 2].place(ask(urls=(A, B, C, D)), choose)
        assert placed is not None
        counts[placed.choice.urls[0]] += 1
    assert counts == {A: 10, B: 10, C: 10, D: 10}


async def test_an_endpoint_taken_by_another_worker_meanwhile_is_chosen_again(
    pair: tuple[WorkerState, WorkerState, FakeClock],
) -> None:
    """The choice is made without the lock: when the other worker reserves the chosen
    endpoint between this worker's view and its reservation, the reservation is refused and
    the request chosen again on a fresh view; the last attempt is reserved whatever."""
    one, two, _ = pair
    seen: list[StateView] = []
    least = scheduled({"least_load": 1.0}, (A, B), seen=seen)

    def raced(view: StateView) -> Fixed | None:
        choice = least(view)
        if len(seen) == 1:  # the other worker takes the same idle endpoint right now
            two._add(A, 1, 1)
        return choice

    placed = await one.place(ask(urls=(A, B)), raced)
    assert placed is not None and placed.choice.urls == (B,)  # chosen again: A was taken
    assert [v.load_of(A).requests for v in seen] == [0, 1]
    assert await loads(one, A, B) == {A: LoadCounts(1, 1), B: LoadCounts(1, 1)}

    def always_taken(view: StateView) -> Fixed | None:
        two._add(A, 1, 0)
        return Fixed((A,))

    placed = await one.place(ask(urls=(A, B)), always_taken)
    assert placed is not None and placed.choice.urls == (A,)  # forced on the last attempt
    assert (await loads(one, A))[A].requests == 1 + ATTEMPTS + 1


async def test_what_a_finish_teaches_reaches_every_worker(
    pair: tuple[WorkerState, WorkerState, FakeClock],
) -> None:
    one, two, _ = pair
    await serve(one, C, outcome(chain(SHARED), prompt=100, matched=40, output=30, session="s"))
    view = await read(two, chain(SHARED), "s")
    assert view.session_endpoint == C and view.prefix_share == 0.4
    assert two.learned_output("m") == 30.0
    failed = await reserve(two, D, 1, chain("q" * 80))
    await two.finish(failed, outcome(chain("q" * 80), ok=False))
    assert dict((await read(one, chain("q" * 80))).matched_blocks) == {}  # forgotten there too


async def test_expired_reservations_and_a_dead_worker_leave_the_totals(
    pair: tuple[WorkerState, WorkerState, FakeClock], tmp_path: Path,
) -> None:
    one, two, clock = pair
    await reserve(one, A, 3)
    clock.advance(StateLimits().reservation_ttl_s - 10)
    await reserve(two, B, 4)
    clock.advance(11)  # one's reservation expires, two's not yet
    assert one.in_flight() == {}
    assert await loads(two, A, B) == {A: LoadCounts(), B: LoadCounts(1, 4)}
    two._region.clear_worker(1)  # what the supervisor does when a worker died
    assert await loads(one, A, B) == {A: LoadCounts(), B: LoadCounts()}


async def test_the_log_wraps_and_a_worker_too_far_behind_skips_ahead(tmp_path: Path) -> None:
    shared = region(tmp_path, log_bytes=16 * 1024)  # a 1,000-block prompt does not fit
    clock = FakeClock()
    one, two = WorkerState(shared, 0, clock=clock), WorkerState(shared, 1, clock=clock)
    for i in range(200):  # ~9 records per ring: it wraps many times
        await serve(one, A, outcome(chain(f"{i:04d}" * 64)), tokens=1)
        assert dict((await read(two, chain(f"{i:04d}" * 64))).matched_blocks) == {A: 32}
    assert two.skipped == 0
    for i in range(100):  # two does not read meanwhile: more than a ring goes by
        await serve(one, B, outcome(chain(f"x{i:03d}" * 64)))
    view = await read(two, chain("x099" * 64))
    assert two.skipped == 1 and dict(view.matched_blocks) == {}  # lost, not garbled
    await serve(one, C, outcome(chain("late" * 64)))
    assert dict((await read(two, chain("late" * 64))).matched_blocks) == {C: 32}
