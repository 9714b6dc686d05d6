"""A router state whose prefix matches come from the engines' own KV events where they publish.

Wraps any :class:`routing.state.protocol.RouterState` (memory, workers', Redis) and a
:class:`routing.kv_events.index.KvEventIndex`. Every view the wrapped state gives (``read``,
and the view ``place`` chooses on) has, for the endpoints the index follows, its
``matched_blocks`` replaced by the index's match, those endpoints named in ``exact_endpoints``
and the host-tier reload cost in ``reload_tokens``; every endpoint's approximate match stays in
``sent_blocks``. ``place`` and ``finish`` tell the index which followed endpoints took the
request and when it ended (its blocks pending there meanwhile). Everything else is the wrapped
state's, whose approximate index takes over for an endpoint whose events stop. Parameters:
none beyond the two objects it joins.

See docs/routing.md#kv-events-and-the-precise-index.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from routing.kv_events.index import KvEventIndex
from routing.load import InFlight
from routing.state.protocol import Ask, C, Outcome, Placed, Reservation, RouterState, StateView
from routing.window import WorkloadMeasures


class EventState:
    """A :class:`RouterState` matching prefixes against engine KV events
    (docs/routing.md#kv-events-and-the-precise-index)."""

    __slots__ = ("_inner", "_index")

    def __init__(self, inner: RouterState, index: KvEventIndex) -> None:
        self._inner = inner
        self._index = index

    @property
    def inner(self) -> RouterState:
        return self._inner

    @property
    def index(self) -> KvEventIndex:
        return self._index

    @property
    def finishes_at_once(self) -> bool:
        """As the inner state's finish (the index's part does no I/O)."""
        return self._inner.finishes_at_once

    def _exact(self, ask: Ask, view: StateView) -> StateView:
        index = self._index
        followed = tuple(url for url in ask.endpoints if index.follows(url))
        if not followed:
            return view
        matched = {url: n for url, n in view.matched_blocks.items() if url not in followed}
        exact, reload = index.match_tiers(ask.block_hashes, followed)
        matched.update(exact)
        return view.replaced(matched_blocks=matched, exact_endpoints=frozenset(followed),
                             reload_tokens=reload or None, sent_blocks=view.matched_blocks)

    def learned_output(self, model: str) -> float | None:
        return self._inner.learned_output(model)

    async def read(self, ask: Ask) -> StateView:
        return self._exact(ask, await self._inner.read(ask))

    async def place(self, ask: Ask, choose: Callable[[StateView], C | None]) -> Placed[C] | None:
        seen: list[StateView] = []

        def exact_choose(view: StateView) -> C | None:
            seen.append(self._exact(ask, view))
            return choose(seen[-1])

        placed = await self._inner.place(ask, exact_choose)
        if placed is None:
            return None
        for url in placed.choice.urls:
            self._index.placed(url, ask.block_hashes)
        return placed.replaced(view=seen[-1]) if seen else placed

    async def finish(self, reservation: Reservation, outcome: Outcome) -> None:
        self._index.finished(reservation.endpoint, outcome.block_hashes)
        await self._inner.finish(reservation, outcome)

    def in_flight(self) -> InFlight:
        return self._inner.in_flight()

    def forget_endpoint(self, url: str) -> None:
        self._inner.forget_endpoint(url)

    def measures(self) -> WorkloadMeasures:
        return self._inner.measures()

    def held_blocks(self) -> Mapping[str, int]:
        """The engines' reported blocks where they publish events, the approximate index's
        elsewhere."""
        held = {url: n for url, n in self._inner.held_blocks().items()
                if not self._index.follows(url)}
        held.update(self._index.held_blocks())
        return held

    async def aclose(self) -> None:
        await self._inner.aclose()


def unwrapped(state: RouterState) -> RouterState:
    """The state under an :class:`EventState` (``state`` itself otherwise)."""
    return state.inner if isinstance(state, EventState) else state
