from __future__ import annotations

import inspect
from collections.abc import AsyncIterator

import pytest

import routing.state.memory
from routing.load import LoadCounts
from routing.state.memory import MemoryState, StateLimits
from routing.state.protocol import RouterState
from routing.window import LengthSummary
from tests.unit.routing.state_contract import (
    A,
    B,
    FakeClock,
    RouterStateContract,
    StateFactory,
    chain,
    outcome,
    read,
    reserve,
    serve,
)


class TestMemoryState(RouterStateContract):
    @pytest.fixture
    async def make_state(self, clock: FakeClock) -> AsyncIterator[StateFactory]:
        made: list[MemoryState] = []

        async def make(limits: StateLimits) -> RouterState:
            state = MemoryState(limits, clock=clock)
            made.append(state)
            return state

        yield make
        for state in made:
            await state.aclose()


COMPILED = not (routing.state.memory.__file__ or "").endswith(".py")


@pytest.mark.skipif(COMPILED, reason="compiled async methods carry no signature: make test "
                    "runs this on the sources (RIDGE_PURE_PYTHON=1)")
@pytest.mark.parametrize("name", ["learned_output", "read", "place", "finish", "in_flight",
                                  "measures", "aclose"])
def test_memory_state_implements_the_protocol_exactly(name: str) -> None:
    state: RouterState = MemoryState()  # the static check; the signatures at run time:
    ours, theirs = getattr(state, name), getattr(RouterState, name)
    assert inspect.iscoroutinefunction(ours) == inspect.iscoroutinefunction(theirs)
    assert list(inspect.signature(ours).parameters) == \
        list(inspect.signature(theirs).parameters)[1:]  # without self


@pytest.mark.parametrize("field", ["max_prefix_entries", "prefix_max_age_s", "max_sessions",
                                   "session_max_age_s", "reservation_ttl_s", "max_reservations",
                                   "window_requests", "max_models"])
def test_limits_must_be_positive(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        StateLimits(**{field: 0})


async def test_measures_show_the_windows_and_the_in_flight_counts() -> None:
    state = MemoryState(StateLimits(window_requests=4), clock=FakeClock())
    for prompt, matched, output in [(100, 0, 10), (300, 300, 20), (200, 100, 30)]:
        await serve(state, A, outcome(prompt=prompt, matched=matched, output=output))
    await serve(state, A, outcome(prompt=400, matched=0, output=None, model="x"))
    await reserve(state, B, 77)
    measures = state.measures()
    assert measures.window == 4
    assert measures.overall.requests == 4
    assert measures.overall.prefix_share == pytest.approx(400 / 1000)
    assert measures.overall.prompt_tokens == LengthSummary(4, 250.0, 200.0, 400.0)
    assert measures.overall.output_tokens == LengthSummary(3, 20.0, 20.0, 30.0)
    assert measures.by_model["m"].prefix_share == pytest.approx(400 / 600)
    assert measures.by_model["x"].output_tokens == LengthSummary()
    assert dict(measures.in_flight) == {B: LoadCounts(1, 77)}


async def test_every_part_stays_within_its_limit() -> None:
    limits = StateLimits(max_prefix_entries=50, max_sessions=5, max_reservations=7,
                         max_models=3)
    state = MemoryState(limits, clock=FakeClock())
    for i in range(40):
        await serve(state, f"http://e{i % 4}", outcome(chain(f"{i:04d}" * 40), prompt=40,
                                                       session=f"s{i}", model=f"m{i % 6}"))
        await reserve(state, A, 1)
        sizes = state.sizes()
        assert sizes.prefix_entries <= 50 and sizes.sessions <= 5
        assert sizes.reservations <= 7 and sizes.models <= 3
    assert (await read(state, urls=(A,))).load_of(A) == LoadCounts(7, 7)


async def test_forgetting_an_endpoint_stops_its_matches() -> None:
    state = MemoryState(clock=FakeClock())
    await serve(state, A, outcome(chain("x" * 64)))
    await serve(state, B, outcome(chain("x" * 64)))
    state.forget_endpoint(A)
    view = await read(state, chain("x" * 64), None, (A, B))
    assert dict(view.matched_blocks) == {B: 8}


async def test_aclose_empties_the_state() -> None:
    state = MemoryState(clock=FakeClock())
    await serve(state, A, outcome(chain("x" * 64)))
    await reserve(state, A, 3)
    await serve(state, A, outcome(session="s"))
    await state.aclose()
    sizes = state.sizes()
    assert (sizes.prefix_entries, sizes.reservations, sizes.sessions) == (0, 0, 0)
