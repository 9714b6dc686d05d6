"""The contract every :class:`routing.state.RouterState` implementation passes.

Use: subclass :class:`RouterStateContract` in a test module and give it a ``make_state``
fixture: an async factory ``(StateLimits) -> RouterState`` whose states read time from the
``clock`` fixture (a :class:`FakeClock`) and are closed by the fixture at teardown. A Redis
implementation passes its clock into its scripts the same way, so these very tests run
against it unchanged. The tests use nothing but the protocol.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

import pytest

from routing.features import block_hashes
from routing.memory_state import StateLimits
from routing.select import Candidate, Group, SelectRequest
from routing.state import LoadCounts, Outcome, Reservation, RouterState

StateFactory = Callable[[StateLimits], Awaitable[RouterState]]
M = "m"


@dataclass
class FakeClock:
    """A clock the test moves by hand (seconds)."""

    now: float = 1_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def chain(text: str) -> tuple[int, ...]:
    """Realistic chained block hashes: one 8-character block per character pair."""
    return block_hashes(text, 8, seed=M)


def outcome(hashes: tuple[int, ...] = (), prompt: int = 0, matched: int = 0,
            output: int | None = None, session: str | None = None, ok: bool = True,
            model: str = M) -> Outcome:
    return Outcome(model=model, block_hashes=hashes, prompt_tokens=prompt,
                   matched_tokens=matched, output_tokens=output, session=session, succeeded=ok)


async def serve(state: RouterState, endpoint: str, out: Outcome, tokens: int = 1) -> None:
    """Reserve on ``endpoint`` and finish at once with ``out``."""
    await state.finish(await state.reserve(endpoint, tokens), out)


async def loads(state: RouterState, *urls: str) -> dict[str, LoadCounts]:
    view = await state.read(M, (), None, urls)
    return {url: view.load_of(url) for url in urls}


A, B, C, D = "http://a", "http://b", "http://c", "http://d"
CANDIDATES = (Candidate(A), Candidate(B), Candidate(C))
SHARED = "sys prompt" * 8  # 80 characters: 10 blocks of 8
LIMITS = StateLimits()


def select_request(hashes: tuple[int, ...], groups: list[Group], session: str | None = None,
                   tokens: int = 10) -> SelectRequest:
    """A request of 100 prompt tokens, 2 tokens per block, over ``groups``."""
    return SelectRequest(model=M, block_hashes=hashes, session=session, endpoints=(A, B, C),
                         groups=tuple(groups), prompt_tokens=100, block_tokens=2,
                         tokens=tokens)


class RouterStateContract:
    """The contract tests; subclasses provide the ``make_state`` fixture."""

    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock()

    @pytest.mark.parametrize(
        ("reserves", "finished", "expected"),
        [
            ([(A, 10)], [], {A: LoadCounts(1, 10), B: LoadCounts()}),
            ([(A, 10), (A, 5), (B, 7)], [], {A: LoadCounts(2, 15), B: LoadCounts(1, 7)}),
            ([(A, 10), (A, 5), (B, 7)], [0], {A: LoadCounts(1, 5), B: LoadCounts(1, 7)}),
            ([(A, 10), (A, 5), (B, 7)], [0, 1, 2], {A: LoadCounts(), B: LoadCounts()}),
            ([(A, 0)], [], {A: LoadCounts(1, 0), B: LoadCounts()}),
        ],
    )
    async def test_reserve_and_finish_count_requests_and_tokens(
        self, make_state: StateFactory, reserves: list[tuple[str, int]], finished: list[int],
        expected: dict[str, LoadCounts],
    ) -> None:
        state = await make_state(LIMITS)
        held = [await state.reserve(url, tokens) for url, tokens in reserves]
        assert [(r.endpoint, r.tokens) for r in held] == reserves
        assert len({r.id for r in held}) == len(held)
        for i in finished:
            await state.finish(held[i], outcome())
        assert await loads(state, A, B) == expected

    async def test_counts_never_go_negative(self, make_state: StateFactory) -> None:
        state = await make_state(LIMITS)
        first, second = await state.reserve(A, 4), await state.reserve(A, 6)
        for _ in range(3):  # finishing twice (a retry of the release) must not count twice
            await state.finish(first, outcome())
        assert await loads(state, A) == {A: LoadCounts(1, 6)}
        await state.finish(second, outcome(ok=False))
        await state.finish(Reservation("never-issued", A, 9), outcome())
        assert await loads(state, A) == {A: LoadCounts()}

    async def test_a_reservation_expires_after_its_ttl(
        self, make_state: StateFactory, clock: FakeClock
    ) -> None:
        state = await make_state(StateLimits(reservation_ttl_s=10.0))
        old = await state.reserve(A, 8)
        clock.advance(6.0)
        young = await state.reserve(A, 3)
        assert await loads(state, A) == {A: LoadCounts(2, 11)}
        clock.advance(4.5)  # old is 10.5 s old: dropped as if its gateway died
        assert await loads(state, A) == {A: LoadCounts(1, 3)}
        await state.finish(old, outcome())  # finishing it late releases nothing more
        assert await loads(state, A) == {A: LoadCounts(1, 3)}
        await state.finish(young, outcome())
        assert await loads(state, A) == {A: LoadCounts()}

    @pytest.mark.parametrize(("succeeded", "expected"), [(True, {A: 10}), (False, {})])
    async def test_prefix_is_recorded_only_on_success(
        self, make_state: StateFactory, succeeded: bool, expected: dict[str, int]
    ) -> None:
        state = await make_state(LIMITS)
        await serve(state, A, outcome(chain(SHARED), prompt=20, ok=succeeded))
        view = await state.read(M, chain(SHARED), None, (A, B))
        assert dict(view.matched_blocks) == expected

    async def test_a_reservation_records_its_blocks_at_once(
        self, make_state: StateFactory
    ) -> None:
        state = await make_state(LIMITS)
        held = await state.reserve(A, 1, chain(SHARED))
        assert held.recorded_from == 0
        view = await state.read(M, chain(SHARED + "more"), None, (A, B))
        assert dict(view.matched_blocks) == {A: 10}  # before the request finishes
        await state.finish(held, outcome(chain(SHARED)))
        view = await state.read(M, chain(SHARED), None, (A, B))
        assert dict(view.matched_blocks) == {A: 10}

    @pytest.mark.parametrize(("held_before", "recorded_from", "after_failure"),
                             [(0, 0, {}), (5, 5, {A: 5}), (10, 10, {A: 10})])
    async def test_a_failed_request_forgets_only_the_blocks_it_added(
        self, make_state: StateFactory, held_before: int, recorded_from: int,
        after_failure: dict[str, int],
    ) -> None:
        state = await make_state(LIMITS)
        if held_before:
            await serve(state, A, outcome(chain(SHARED[:8 * held_before])))
        held = await state.reserve(A, 1, chain(SHARED))
        assert held.recorded_from == recorded_from
        await state.finish(held, outcome(chain(SHARED), ok=False))
        view = await state.read(M, chain(SHARED), None, (A, B))
        assert dict(view.matched_blocks) == after_failure

    async def test_a_reservation_without_blocks_records_nothing(
        self, make_state: StateFactory
    ) -> None:
        state = await make_state(LIMITS)
        held = await state.reserve(A, 1)
        assert held.recorded_from is None
        await state.finish(held, outcome(chain(SHARED), ok=False))
        assert dict((await state.read(M, chain(SHARED), None, (A,))).matched_blocks) == {}

    async def test_select_and_reserve_records_the_blocks_on_each_pick(
        self, make_state: StateFactory
    ) -> None:
        state = await make_state(LIMITS)
        hashes = chain(SHARED)
        groups = [Group((Candidate(A), Candidate(B))), Group((Candidate(C),))]
        selection = await state.select_and_reserve(select_request(hashes, groups))
        assert selection.endpoints == (A, C)
        assert [r.recorded_from for r in selection.reservations] == [0, 0]
        assert dict(selection.view.matched_blocks) == {}  # the view before the reservation
        # the next request sharing the prompt goes where the first one went
        whole = replace(select_request(hashes, groups[:1]), prompt_tokens=20)  # all cached on A
        again = await state.select_and_reserve(whole)
        assert again.endpoints == (A,)
        assert again.reservations[0].recorded_from == 10
        assert dict(again.view.matched_blocks) == {A: 10, C: 10}

    @pytest.mark.parametrize(
        ("served", "request_text", "endpoints", "expected"),
        [
            ({A: SHARED}, SHARED, (A, B), {A: 10}),
            ({A: SHARED}, SHARED + "user one", (A, B), {A: 10}),  # the shared prefix
            ({A: SHARED + "user one"}, SHARED + "user two", (A,), {A: 10}),
            ({A: SHARED[:40], B: SHARED}, SHARED + "tail....", (A, B), {A: 5, B: 10}),
            ({A: SHARED}, SHARED, (B,), {}),  # only the endpoints asked about
            ({A: SHARED}, "other" + SHARED, (A, B), {}),  # chained: a different start
            ({A: SHARED}, "", (A,), {}),
        ],
    )
    async def test_match_after_finish(
        self, make_state: StateFactory, served: dict[str, str], request_text: str,
        endpoints: tuple[str, ...], expected: dict[str, int],
    ) -> None:
        state = await make_state(LIMITS)
        for url, text in served.items():
            await serve(state, url, outcome(chain(text)))
        view = await state.read(M, chain(request_text), None, endpoints)
        assert dict(view.matched_blocks) == expected

    async def test_a_session_binds_to_the_endpoint_that_served_it(
        self, make_state: StateFactory, clock: FakeClock
    ) -> None:
        state = await make_state(StateLimits(session_max_age_s=60.0))
        assert (await state.read(M, (), "s1", (A,))).session_endpoint is None
        await serve(state, A, outcome(session="s1"))
        await serve(state, B, outcome(session="s1", ok=False))  # a failure does not rebind
        assert (await state.read(M, (), "s1", (A, B))).session_endpoint == A
        assert (await state.read(M, (), "s2", (A, B))).session_endpoint is None
        assert (await state.read(M, (), None, (A, B))).session_endpoint is None
        await serve(state, B, outcome(session="s1"))
        assert (await state.read(M, (), "s1", (A, B))).session_endpoint == B
        clock.advance(61.0)
        assert (await state.read(M, (), "s1", (A, B))).session_endpoint is None

    @pytest.mark.parametrize(
        ("window", "observed", "expected"),
        [
            (3, [], None),
            (3, [(100, 0)], 0.0),
            (3, [(100, 0), (100, 50), (200, 200)], 250 / 400),
            (3, [(100, 0), (100, 50), (200, 200), (100, 100)], 350 / 400),  # first drops out
            (2, [(100, 100), (0, 0)], 1.0),
            (3, [(100, 150)], 1.0),  # a match never exceeds the prompt
        ],
    )
    async def test_prefix_share_over_the_window(
        self, make_state: StateFactory, window: int, observed: list[tuple[int, int]],
        expected: float | None,
    ) -> None:
        state = await make_state(StateLimits(window_requests=window))
        for prompt, matched in observed:
            await serve(state, A, outcome(prompt=prompt, matched=matched))
        await serve(state, A, outcome(prompt=1000, matched=0, model="other"))
        await serve(state, A, outcome(prompt=1000, matched=1000, ok=False))  # not counted
        view = await state.read(M, (), None, (A,))
        assert view.prefix_share == pytest.approx(expected)
        assert (await state.read("other", (), None, (A,))).prefix_share == 0.0
        assert (await state.read("unseen", (), None, (A,))).prefix_share is None

    @pytest.mark.parametrize(
        ("window", "outputs", "expected"),
        [
            (4, [], None),
            (4, [None], None),
            (4, [100, 200, None, 300], 200.0),
            (2, [100, 200, None, 300], 250.0),
        ],
    )
    async def test_output_estimate_is_the_mean_over_the_window(
        self, make_state: StateFactory, window: int, outputs: list[int | None],
        expected: float | None,
    ) -> None:
        state = await make_state(StateLimits(window_requests=window))
        for tokens in outputs:
            await serve(state, A, outcome(prompt=10, output=tokens))
        await serve(state, A, outcome(prompt=10, output=9999, ok=False))
        await serve(state, A, outcome(prompt=10, output=5, model="other"))
        view = await state.read(M, (), None, (A,))
        assert view.expected_output_tokens == pytest.approx(expected)

    async def test_read_of_unknown_endpoints_gives_zeros(self, make_state: StateFactory) -> None:
        state = await make_state(LIMITS)
        await serve(state, A, outcome(chain(SHARED), session="s"))
        view = await state.read(M, chain(SHARED), None, ("http://x", "http://y"))
        assert view.load_of("http://x") == LoadCounts()
        assert view.load_of("http://y") == LoadCounts()
        assert dict(view.matched_blocks) == {}
        empty = await state.read("unseen", (), None, ())
        assert (empty.prefix_share, empty.expected_output_tokens) == (None, None)

    async def test_concurrent_reserve_and_finish_leave_no_count(
        self, make_state: StateFactory
    ) -> None:
        state = await make_state(LIMITS)
        urls = (A, B, C)

        async def one(i: int) -> None:
            held = await state.reserve(urls[i % 3], i)
            await asyncio.sleep(0)
            await state.finish(held, outcome(chain(SHARED), prompt=10, output=i % 7))

        held = await asyncio.gather(*(state.reserve(urls[i % 3], 2) for i in range(300)))
        assert await loads(state, *urls) == {url: LoadCounts(100, 200) for url in urls}
        await asyncio.gather(*(one(i) for i in range(600)))
        await asyncio.gather(*(state.finish(r, outcome()) for r in held))
        assert await loads(state, *urls) == {url: LoadCounts() for url in urls}

    async def test_sessions_are_bounded(self, make_state: StateFactory) -> None:
        state = await make_state(StateLimits(max_sessions=2))
        for session, url in (("s1", A), ("s2", B), ("s3", C)):
            await serve(state, url, outcome(session=session))
        found = [(await state.read(M, (), s, (A, B, C))).session_endpoint
                 for s in ("s1", "s2", "s3")]
        assert found == [None, B, C]

    async def test_the_prefix_index_is_bounded_and_ages(
        self, make_state: StateFactory, clock: FakeClock
    ) -> None:
        state = await make_state(StateLimits(max_prefix_entries=20, prefix_max_age_s=30.0))
        texts = {A: "a" * 80, B: "b" * 80, C: "c" * 80}  # 10 blocks each
        for url, text in texts.items():
            await serve(state, url, outcome(chain(text)))
            clock.advance(10.0)
        matches = [dict((await state.read(M, chain(t), None, (A, B, C))).matched_blocks)
                   for t in texts.values()]
        assert matches == [{}, {B: 10}, {C: 10}]  # A's blocks were the least recent
        clock.advance(11.0)  # B's record is now 31 s old, C's 21 s
        assert dict((await state.read(M, chain(texts[B]), None, (B,))).matched_blocks) == {}
        assert dict((await state.read(M, chain(texts[C]), None, (C,))).matched_blocks) == {C: 10}

    @pytest.mark.parametrize(
        ("weights", "served", "busy", "expected"),
        [
            ({"cache_aware": 1.0}, {}, {}, A),  # all equal: the first in pool order
            ({"cache_aware": 1.0}, {B: SHARED}, {}, B),  # the cached prefix
            ({"cache_aware": 1.0}, {}, {A: 2}, B),  # the least loaded
            ({"least_load": 1.0}, {B: SHARED}, {B: 1}, A),
            ({"prefix_match": 1.0}, {C: SHARED}, {C: 5}, C),  # load ignored
            ({"session_affinity": 1.0}, {}, {}, A),  # no session bound yet: a tie
        ],
    )
    async def test_select_and_reserve_scores_then_reserves(
        self, make_state: StateFactory, weights: dict[str, float], served: dict[str, str],
        busy: dict[str, int], expected: str,
    ) -> None:
        state = await make_state(LIMITS)
        for url, text in served.items():
            await serve(state, url, outcome(chain(text)))
        for url, n in busy.items():
            for _ in range(n):
                await state.reserve(url, 1)
        request = select_request(chain(SHARED), [Group(CANDIDATES, weights)], tokens=30)
        chosen = await state.select_and_reserve(request)
        assert chosen.endpoints == (expected,)
        assert [(r.endpoint, r.tokens) for r in chosen.reservations] == [(expected, 30)]
        assert chosen.view.load_of(expected).requests == busy.get(expected, 0)
        after = await loads(state, expected)
        assert after[expected] == LoadCounts(busy.get(expected, 0) + 1,
                                             busy.get(expected, 0) + 30)
        await state.finish(chosen.reservations[0], outcome())
        assert (await loads(state, expected))[expected].requests == busy.get(expected, 0)

    async def test_select_and_reserve_returns_the_view_it_chose_on(
        self, make_state: StateFactory
    ) -> None:
        state = await make_state(LIMITS)
        await serve(state, B, outcome(chain(SHARED), prompt=20, matched=5, output=40,
                                      session="s"))
        request = select_request(chain(SHARED + "tail...."), [Group(CANDIDATES)], session="s")
        view = (await state.select_and_reserve(request)).view
        assert dict(view.matched_blocks) == {B: 10}
        assert (view.prefix_share, view.expected_output_tokens) == (0.25, 40.0)
        assert view.session_endpoint == B

    async def test_a_pair_reserves_one_endpoint_per_group(self, make_state: StateFactory) -> None:
        state = await make_state(LIMITS)
        await state.reserve(A, 1)
        groups = [Group((Candidate(A), Candidate(B))), Group((Candidate(C),))]
        chosen = await state.select_and_reserve(select_request((), groups, tokens=5))
        assert chosen.endpoints == (B, C)
        assert [r.endpoint for r in chosen.reservations] == [B, C]
        assert await loads(state, A, B, C) == {A: LoadCounts(1, 1), B: LoadCounts(1, 5),
                                               C: LoadCounts(1, 5)}

    async def test_concurrent_selects_spread_like_one_gateway(
        self, make_state: StateFactory
    ) -> None:
        state = await make_state(LIMITS)
        request = select_request(chain(SHARED), [Group(CANDIDATES + (Candidate(D),))])
        chosen = await asyncio.gather(*(state.select_and_reserve(request) for _ in range(40)))
        counts = {url: 0 for url in (A, B, C, D)}
        for selection in chosen:
            counts[selection.endpoints[0]] += 1
        assert counts == {A: 10, B: 10, C: 10, D: 10}

    async def test_select_counts_the_callers_own_and_the_engines_load(
        self, make_state: StateFactory
    ) -> None:
        state = await make_state(LIMITS)
        group = Group((Candidate(A, in_flight=3), Candidate(B, queued=2.0), Candidate(C, 1, 2.5)))
        chosen = await state.select_and_reserve(select_request((), [group]))
        assert chosen.endpoints == (B,)  # loads 3, 2, max(1, 2.5): the largest count, not a sum
