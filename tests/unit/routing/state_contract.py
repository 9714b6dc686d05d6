"""The contract every :class:`routing.state.protocol.RouterState` implementation passes.

Use: subclass :class:`RouterStateContract` in a test module and give it a ``make_state``
fixture: an async factory ``(StateLimits) -> RouterState`` whose states read time from the
``clock`` fixture (a :class:`FakeClock`) and are closed by the fixture at teardown. A Redis
implementation passes its clock into its scripts the same way, so these very tests run
against it unchanged. The tests use nothing but the protocol.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

import pytest

from routing.features import RequestFeatures, block_hashes
from routing.load import LoadCounts
from routing.scheduler.catalog import build_scheduler
from routing.scheduler.framework import SchedulerConfig, SchedulingContext
from routing.snapshots import EndpointSnapshot, EngineMetrics, PoolSnapshot
from routing.state.memory import StateLimits
from routing.state.protocol import Ask, Outcome, Reservation, RouterState, StateView
from tests.fakes.harness import ends_without_suspending

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


@dataclass(frozen=True)
class Fixed:
    """A choice of fixed endpoints."""

    urls: tuple[str, ...]


A, B, C, D = "http://a", "http://b", "http://c", "http://d"
SHARED = "sys prompt" * 8  # 80 characters: 10 blocks of 8
LIMITS = StateLimits()


def ask(hashes: Sequence[int] = (), session: str | None = None,
        urls: Sequence[str] = (A, B, C), tokens: int = 1, model: str = M) -> Ask:
    return Ask(model, hashes, session, urls, tokens)


async def read(state: RouterState, hashes: Sequence[int] = (), session: str | None = None,
               urls: Sequence[str] = (A, B, C), model: str = M) -> StateView:
    return await state.read(ask(hashes, session, urls, model=model))


async def reserve(state: RouterState, endpoint: str, tokens: int,
                  hashes: Sequence[int] = ()) -> Reservation:
    """Place a request on ``endpoint`` whatever the view says."""
    placed = await state.place(ask(hashes, urls=(endpoint,), tokens=tokens),
                               lambda view: Fixed((endpoint,)))
    assert placed is not None
    return placed.reservations[0]


async def serve(state: RouterState, endpoint: str, out: Outcome, tokens: int = 1) -> None:
    """Reserve on ``endpoint`` and finish at once with ``out``."""
    await state.finish(await reserve(state, endpoint, tokens), out)


async def loads(state: RouterState, *urls: str) -> dict[str, LoadCounts]:
    view = await read(state, urls=urls)
    return {url: view.load_of(url) for url in urls}


def scheduled(weights: Mapping[str, float], urls: Sequence[str] = (A, B, C),
              hashes: Sequence[int] = (), session: str | None = None,
              engine: Mapping[str, float] | None = None, seen: list[StateView] | None = None,
              prompt_tokens: int = 100) -> Callable[[StateView], Fixed | None]:
    """A ``choose`` that runs the real scheduler plugins (scorers ``weights``, max_score) over
    a pool of ``urls`` for a request of ``prompt_tokens``, 2 per block; ``engine``: each
    endpoint's engine running count; ``seen`` collects the views it chose on."""
    scheduler = build_scheduler(SchedulerConfig(scorers=tuple(weights.items())))
    pool = PoolSnapshot("p", "vllm", "mixed", (M,), tuple(
        EndpointSnapshot(u, "p", True, EngineMetrics(running=(engine or {}).get(u)))
        for u in urls))
    features = RequestFeatures(M, tuple(hashes), 2, prompt_tokens, 10, 10, session, False)

    def choose(view: StateView) -> Fixed | None:
        if seen is not None:
            seen.append(view)
        pick = scheduler.schedule(SchedulingContext(features, pool, view)).endpoint
        return Fixed((pick.url,)) if pick is not None else None
    return choose


class RouterStateContract:
    """The contract tests; subclasses provide the ``make_state`` fixture."""

    SPREAD_SLACK = 0
    """How far from its fair share a concurrent burst may leave an endpoint (0: exactly)."""

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
        held = [await reserve(state, url, tokens) for url, tokens in reserves]
        assert [(r.endpoint, r.tokens) for r in held] == reserves
        assert len({r.id for r in held}) == len(held)
        for i in finished:
            await state.finish(held[i], outcome())
        assert await loads(state, A, B) == expected

    async def test_a_finish_said_to_run_at_once_never_suspends(
            self, make_state: StateFactory) -> None:
        """A state whose ``finishes_at_once`` is true is finished in the caller's task, with
        no task to shield it (:meth:`gateway.request.dispatch.Dispatcher.finish`): its finish must
        end on its first step, after a success and after a failure."""
        state = await make_state(LIMITS)
        if not state.finishes_at_once:
            pytest.skip("this state's finish awaits I/O: it is shielded in a task of its own")
        for ok in (True, False):
            held = await reserve(state, A, 5, chain(SHARED))
            assert ends_without_suspending(state.finish(held, outcome(chain(SHARED), ok=ok)))
        assert await loads(state, A) == {A: LoadCounts()}

    async def test_counts_never_go_negative(self, make_state: StateFactory) -> None:
        state = await make_state(LIMITS)
        first, second = await reserve(state, A, 4), await reserve(state, A, 6)
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
        old = await reserve(state, A, 8)
        clock.advance(6.0)
        young = await reserve(state, A, 3)
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
        view = await read(state, chain(SHARED), None, (A, B))
        assert dict(view.matched_blocks) == expected

    async def test_a_reservation_records_its_blocks_at_once(
        self, make_state: StateFactory
    ) -> None:
        state = await make_state(LIMITS)
        held = await reserve(state, A, 1, chain(SHARED))
        assert held.recorded_from == 0
        view = await read(state, chain(SHARED + "more"), None, (A, B))
        assert dict(view.matched_blocks) == {A: 10}  # before the request finishes
        await state.finish(held, outcome(chain(SHARED)))
        view = await read(state, chain(SHARED), None, (A, B))
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
        held = await reserve(state, A, 1, chain(SHARED))
        assert held.recorded_from == recorded_from
        await state.finish(held, outcome(chain(SHARED), ok=False))
        view = await read(state, chain(SHARED), None, (A, B))
        assert dict(view.matched_blocks) == after_failure

    @pytest.mark.parametrize(("served", "asked", "expected"), [
        (40, 40, 40),  # a long chain held whole: exact
        (38, 41, 36),  # a follow-up: the deepest key both chains have (block 35, 16 + 5 × 4 − 1)
        (23, 40, 20),  # short by less than a stride
        (12, 40, 12),  # within the dense blocks: exact
    ])
    async def test_a_long_chain_matches_to_its_keys(
        self, make_state: StateFactory, served: int, asked: int, expected: int
    ) -> None:
        """Past the index's 16 dense blocks one block in 4 is a key (routing.prefix_index):
        every state counts a long chain's match the same way."""
        long = chain(SHARED * 5)  # 50 blocks
        await serve(state := await make_state(LIMITS), A, outcome(long[:served]))
        assert dict((await read(state, long[:asked], None, (A, B))).matched_blocks) == \
            {A: expected}

    @pytest.mark.parametrize(("held_before", "after_failure"), [(20, 20), (24, 24), (30, 28)])
    async def test_a_failed_long_request_forgets_only_the_keys_it_added(
        self, make_state: StateFactory, held_before: int, after_failure: int
    ) -> None:
        state = await make_state(LIMITS)
        long = chain(SHARED * 5)  # 50 blocks
        await serve(state, A, outcome(long[:held_before]))
        held = await reserve(state, A, 1, long)
        assert held.recorded_from == after_failure  # what A held, rounded down to a key
        assert dict((await read(state, long, None, (A,))).matched_blocks) == {A: 50}
        await state.finish(held, outcome(long, ok=False))
        assert dict((await read(state, long, None, (A,))).matched_blocks) == \
            {A: after_failure}

    async def test_a_reservation_without_blocks_records_nothing(
        self, make_state: StateFactory
    ) -> None:
        state = await make_state(LIMITS)
        held = await reserve(state, A, 1)
        assert held.recorded_from is None
        await state.finish(held, outcome(chain(SHARED), ok=False))
        assert dict((await read(state, chain(SHARED), None, (A,))).matched_blocks) == {}

    async def test_place_records_the_blocks_on_each_endpoint_of_the_choice(
        self, make_state: StateFactory
    ) -> None:
        state = await make_state(LIMITS)
        hashes = chain(SHARED)
        pair = await state.place(ask(hashes, tokens=5), lambda view: Fixed((A, C)))
        assert pair is not None and pair.choice.urls == (A, C)
        assert [(r.endpoint, r.tokens) for r in pair.reservations] == [(A, 5), (C, 5)]
        assert [r.recorded_from for r in pair.reservations] == [0, 0]
        assert dict(pair.view.matched_blocks) == {}  # the view before the reservation
        # the next request sharing the prompt goes where the first one went
        whole = scheduled({"cache_aware": 1.0}, (A, B), hashes, prompt_tokens=20)  # all on A
        again = await state.place(ask(hashes), whole)
        assert again is not None and again.choice.urls == (A,)
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
        view = await read(state, chain(request_text), None, endpoints)
        assert dict(view.matched_blocks) == expected

    async def test_a_session_binds_to_the_endpoint_that_served_it(
        self, make_state: StateFactory, clock: FakeClock
    ) -> None:
        state = await make_state(StateLimits(session_max_age_s=60.0))
        assert (await read(state, (), "s1", (A,))).session_endpoint is None
        await serve(state, A, outcome(session="s1"))
        await serve(state, B, outcome(session="s1", ok=False))  # a failure does not rebind
        assert (await read(state, (), "s1", (A, B))).session_endpoint == A
        assert (await read(state, (), "s2", (A, B))).session_endpoint is None
        assert (await read(state, (), None, (A, B))).session_endpoint is None
        await serve(state, B, outcome(session="s1"))
        assert (await read(state, (), "s1", (A, B))).session_endpoint == B
        clock.advance(61.0)
        assert (await read(state, (), "s1", (A, B))).session_endpoint is None

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
        view = await read(state, (), None, (A,))
        assert view.prefix_share == pytest.approx(expected)
        assert (await read(state, (), None, (A,), model="other")).prefix_share == 0.0
        assert (await read(state, (), None, (A,), model="unseen")).prefix_share is None

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
        assert state.learned_output(M) == pytest.approx(expected)

    async def test_read_of_unknown_endpoints_gives_zeros(self, make_state: StateFactory) -> None:
        state = await make_state(LIMITS)
        await serve(state, A, outcome(chain(SHARED), session="s"))
        view = await read(state, chain(SHARED), None, ("http://x", "http://y"))
        assert view.load_of("http://x") == LoadCounts()
        assert view.load_of("http://y") == LoadCounts()
        assert dict(view.matched_blocks) == {}
        empty = await read(state, (), None, (), model="unseen")
        assert (empty.prefix_share, state.learned_output("unseen")) == (None, None)

    async def test_concurrent_reserve_and_finish_leave_no_count(
        self, make_state: StateFactory
    ) -> None:
        state = await make_state(LIMITS)
        urls = (A, B, C)

        async def one(i: int) -> None:
            held = await reserve(state, urls[i % 3], i)
            await asyncio.sleep(0)
            await state.finish(held, outcome(chain(SHARED), prompt=10, output=i % 7))

        held = await asyncio.gather(*(reserve(state, urls[i % 3], 2) for i in range(300)))
        assert await loads(state, *urls) == {url: LoadCounts(100, 200) for url in urls}
        await asyncio.gather(*(one(i) for i in range(600)))
        await asyncio.gather(*(state.finish(r, outcome()) for r in held))
        assert await loads(state, *urls) == {url: LoadCounts() for url in urls}

    async def test_sessions_are_bounded(self, make_state: StateFactory) -> None:
        state = await make_state(StateLimits(max_sessions=2))
        for session, url in (("s1", A), ("s2", B), ("s3", C)):
            await serve(state, url, outcome(session=session))
        found = [(await read(state, (), s, (A, B, C))).session_endpoint
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
        matches = [dict((await read(state, chain(t), None, (A, B, C))).matched_blocks)
                   for t in texts.values()]
        assert matches == [{}, {B: 10}, {C: 10}]  # A's blocks were the least recent
        clock.advance(11.0)  # B's record is now 31 s old, C's 21 s
        assert dict((await read(state, chain(texts[B]), None, (B,))).matched_blocks) == {}
        assert dict((await read(state, chain(texts[C]), None, (C,))).matched_blocks) == {C: 10}

    @pytest.mark.parametrize(
        ("weights", "served", "busy", "best"),
        [
            ({"cache_aware": 1.0}, {}, {}, (A, B, C)),  # all equal: a tie
            ({"cache_aware": 1.0}, {B: SHARED}, {}, (B,)),  # the cached prefix
            ({"cache_aware": 1.0}, {}, {A: 2}, (B, C)),  # the least loaded (two tie)
            ({"least_load": 1.0}, {B: SHARED}, {B: 1}, (A, C)),
            ({"prefix_match": 1.0}, {C: SHARED}, {C: 5}, (C,)),  # load ignored
            ({"session_affinity": 1.0}, {}, {}, (A, B, C)),  # no session bound yet: a tie
        ],
    )
    async def test_place_runs_the_scheduler_on_the_view_then_reserves(
        self, make_state: StateFactory, weights: dict[str, float], served: dict[str, str],
        busy: dict[str, int], best: tuple[str, ...],
    ) -> None:
        # ties go to the tied endpoint the request's digest (its deepest block hash) names
        expected = best[chain(SHARED)[-1] % len(best)]
        state = await make_state(LIMITS)
        for url, text in served.items():
            await serve(state, url, outcome(chain(text)))
        for url, n in busy.items():
            for _ in range(n):
                await reserve(state, url, 1)
        chosen = await state.place(ask(chain(SHARED), tokens=30),
                                   scheduled(weights, hashes=chain(SHARED)))
        assert chosen is not None and chosen.choice.urls == (expected,)
        assert [(r.endpoint, r.tokens) for r in chosen.reservations] == [(expected, 30)]
        assert chosen.view.load_of(expected).requests == busy.get(expected, 0)
        after = await loads(state, expected)
        assert after[expected] == LoadCounts(busy.get(expected, 0) + 1,
                                             busy.get(expected, 0) + 30)
        await state.finish(chosen.reservations[0], outcome())
        assert (await loads(state, expected))[expected].requests == busy.get(expected, 0)

    async def test_place_returns_the_view_it_chose_on(self, make_state: StateFactory) -> None:
        state = await make_state(LIMITS)
        await serve(state, B, outcome(chain(SHARED), prompt=20, matched=5, output=40,
                                      session="s"))
        seen: list[StateView] = []
        hashes = chain(SHARED + "tail....")
        placed = await state.place(ask(hashes, "s"), scheduled({"cache_aware": 1.0},
                                                               hashes=hashes, seen=seen))
        assert placed is not None and placed.view == seen[-1]
        assert dict(placed.view.matched_blocks) == {B: 10}
        assert placed.view.prefix_share == 0.25
        assert placed.view.session_endpoint == B
        assert state.learned_output(M) == 40.0

    async def test_no_choice_reserves_nothing(self, make_state: StateFactory) -> None:
        state = await make_state(LIMITS)
        assert await state.place(ask(chain(SHARED), tokens=9), lambda view: None) is None
        assert await loads(state, A, B, C) == {u: LoadCounts() for u in (A, B, C)}
        assert dict((await read(state, chain(SHARED))).matched_blocks) == {}

    async def test_concurrent_places_spread_like_one_gateway(
        self, make_state: StateFactory
    ) -> None:
        state = await make_state(LIMITS)
        choose = scheduled({"cache_aware": 1.0}, (A, B, C, D))  # no prefix: least load
        chosen = await asyncio.gather(*(state.place(ask(urls=(A, B, C, D)), choose)
                                        for _ in range(40)))
        counts = {url: 0 for url in (A, B, C, D)}
        for placed in chosen:
            assert placed is not None
            counts[placed.choice.urls[0]] += 1
        assert all(abs(n - 10) <= self.SPREAD_SLACK for n in counts.values()), counts

    async def test_the_choice_counts_the_state_and_the_engines_load(
        self, make_state: StateFactory
    ) -> None:
        state = await make_state(LIMITS)
        for _ in range(3):
            await reserve(state, A, 1)
        await reserve(state, C, 1)
        choose = scheduled({"least_load": 1.0}, engine={B: 2.0, C: 2.5})
        chosen = await state.place(ask(), choose)
        # loads 3, 2, max(1, 2.5): the larger count, not a sum
        assert chosen is not None and chosen.choice.urls == (B,)

