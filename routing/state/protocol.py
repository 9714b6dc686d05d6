"""Everything the router remembers, behind one small async interface.

The router keeps no memory of its own: the prefix index, the in-flight requests and tokens per
endpoint (the ONE place they are counted, :mod:`routing.load`), the prefix-share window and the
learned output lengths, and session affinity all live behind :class:`RouterState`. The
in-memory implementation (:mod:`routing.state.memory`) serves one gateway process; shared ones
(the workers', Redis) let many gateway processes route as one. All pass one contract suite.

One routing path: :meth:`RouterState.place` is handed the request's :class:`Ask` and a pure
``choose`` function (the router) and returns the choice with one reservation per chosen
endpoint, which also records the request's prompt blocks there at once; a shared state reserves
only if no other gateway took the chosen endpoints meanwhile. :meth:`RouterState.finish`
releases the reservation and records what was learned (a failed request's new blocks are
forgotten). Reservations expire after a TTL, so a crashed gateway cannot hold them forever.

See docs/routing.md#the-router-state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final, Generic, Protocol, TypeVar

from routing.load import NO_LOAD, InFlight, LoadCounts
from routing.native_value import NativeValue
from routing.window import WorkloadMeasures


class StateView(NativeValue):
    """One read of the router's memory for one request.

    ``matched_blocks``: per endpoint URL, how many leading prompt blocks it probably holds
    (only endpoints with at least one). ``load``: in-flight counts per endpoint URL (missing =
    none). ``prefix_share``: the recent fraction of prompt tokens that matched somewhere, for
    the request's model, in [0, 1] (None before any observation). ``session_endpoint``: the
    endpoint this request's session last used, if any. ``exact_endpoints``: the endpoints whose
    match comes from the engine's own KV events (:mod:`routing.kv_events.state`); the others' is the
    approximate index's guess from what was sent there. ``reload_tokens``: per endpoint whose
    match reaches into its host KV tier (known from its events), what reloading those blocks
    costs, in prompt tokens recomputed [tokens] (``KvEventIndex.match_tiers``; None: no such
    match, and no dictionary made for every view). ``sent_blocks``: where ``exact_endpoints``
    is not empty, the approximate index's match for every endpoint — the leading blocks sent
    there, evicted or not, so the session's home (None: ``matched_blocks`` is that match).
    ``footprint``: per endpoint URL, how many prompt blocks the prefix index recently recorded
    there (:meth:`PrefixIndex.footprint`, read when called, so a view that never asks costs
    nothing; None: the state keeps no such count). ``recent_requests``: likewise, how many
    requests the prefix index recently recorded there (:meth:`PrefixIndex.recent_requests`).
    ``matched_blocks`` and ``load`` left out (None): empty.
    """

    FIELDS = ("matched_blocks", "load", "prefix_share", "session_endpoint", "exact_endpoints",
              "reload_tokens", "sent_blocks", "footprint", "recent_requests")
    __slots__ = FIELDS

    def __init__(self, matched_blocks: dict[str, int] | None = None,
                 load: InFlight | None = None, prefix_share: float | None = None,
                 session_endpoint: str | None = None,
                 exact_endpoints: frozenset[str] = frozenset(),
                 reload_tokens: dict[str, float] | None = None,
                 sent_blocks: dict[str, int] | None = None,
                 footprint: Callable[[str], int] | None = None,
                 recent_requests: Callable[[str], int] | None = None) -> None:
        self.matched_blocks: Final[dict[str, int]] = \
            {} if matched_blocks is None else matched_blocks
        self.load: Final[InFlight] = {} if load is None else load
        self.prefix_share: Final = prefix_share
        self.session_endpoint: Final = session_endpoint
        self.exact_endpoints: Final = exact_endpoints
        self.reload_tokens: Final = reload_tokens
        self.sent_blocks: Final = sent_blocks
        self.footprint: Final = footprint
        self.recent_requests: Final = recent_requests

    def load_of(self, url: str) -> LoadCounts:
        return self.load.get(url, NO_LOAD)


class Ask(NativeValue):
    """What the state reads for one request and what it reserves: the request's model, its
    prompt block hashes and session, the endpoint URLs whose matches and loads the view
    carries (every endpoint serving the model), and the tokens each reservation counts
    (:func:`routing.load.request_tokens`)."""

    FIELDS = ("model", "block_hashes", "session", "endpoints", "tokens")
    __slots__ = FIELDS

    def __init__(self, model: str, block_hashes: Sequence[int], session: str | None,
                 endpoints: Sequence[str], tokens: int = 0) -> None:
        self.model: Final = model
        self.block_hashes: Final = block_hashes
        self.session: Final = session
        self.endpoints: Final = endpoints
        self.tokens: Final = tokens


class Choice(Protocol):
    """What ``choose`` returns: it names the endpoints to reserve, in order."""

    @property
    def urls(self) -> tuple[str, ...]: ...


C = TypeVar("C", bound=Choice)


class Reservation(NativeValue):
    """A request counted on an endpoint; hand it back to ``finish``. ``recorded_from``: the
    first of the request's prompt blocks the reservation recorded on ``endpoint`` that it did
    not hold before (None: it recorded none), forgotten again if the request fails."""

    FIELDS = ("id", "endpoint", "tokens", "recorded_from")
    __slots__ = FIELDS

    def __init__(self, id: str, endpoint: str, tokens: int,
                 recorded_from: int | None = None) -> None:
        self.id: Final = id
        self.endpoint: Final = endpoint
        self.tokens: Final = tokens
        self.recorded_from: Final = recorded_from


class Placed(NativeValue, Generic[C]):
    """A choice, its reservations (one per ``choice.urls``, same order) and the view it was
    made on (before the reservations)."""

    FIELDS = ("choice", "reservations", "view")
    __slots__ = FIELDS

    def __init__(self, choice: C, reservations: tuple[Reservation, ...],
                 view: StateView) -> None:
        self.choice: Final = choice
        self.reservations: Final = reservations
        self.view: Final = view


class Outcome(NativeValue):
    """What one finished request taught the router."""

    FIELDS = ("model", "block_hashes", "prompt_tokens", "matched_tokens", "output_tokens",
              "session", "succeeded")
    __slots__ = FIELDS

    def __init__(self, model: str, block_hashes: Sequence[int], prompt_tokens: int,
                 matched_tokens: int, output_tokens: int | None, session: str | None,
                 succeeded: bool) -> None:
        self.model: Final = model
        self.block_hashes: Final = block_hashes
        self.prompt_tokens: Final = prompt_tokens
        self.matched_tokens: Final = matched_tokens
        self.output_tokens: Final = output_tokens
        self.session: Final = session
        self.succeeded: Final = succeeded


class RouterState(Protocol):
    """The router's memory. Implementations must not raise on the hot path for their own
    failures (a shared state that fails falls back to local state)."""

    def learned_output(self, model: str) -> float | None:
        """The learned mean output length of ``model`` [tokens], from this process's memory
        without I/O (None = unknown)."""
        ...

    async def read(self, ask: Ask) -> StateView:
        """The view ``place`` would choose on, without reserving anything."""
        ...

    async def place(self, ask: Ask, choose: Callable[[StateView], C | None]) -> Placed[C] | None:
        """Read, ``choose`` on the view, and reserve every endpoint of the choice (recording
        the request's blocks there) with no other reservation of those endpoints in between.
        None when ``choose`` returns None (nothing is reserved)."""
        ...

    async def finish(self, reservation: Reservation, outcome: Outcome) -> None:
        """Release ``reservation``; on success remember the blocks as cached on its endpoint,
        bind the session to it, and feed the prefix-share window and output estimate; on
        failure forget the blocks the reservation recorded (from ``recorded_from`` on)."""
        ...

    @property
    def finishes_at_once(self) -> bool:
        """Whether :meth:`finish` always runs to its end without suspending (no I/O): then no
        cancellation can interrupt it, and a caller that must see it through needs no task
        of its own to shield it."""
        ...

    def in_flight(self) -> InFlight:
        """This gateway's own reservations per endpoint (for its gauges)."""
        ...

    def forget_endpoint(self, url: str) -> None:
        """Stop matching the prefixes recorded for ``url``, in this process's memory: it left
        the fleet (an address a new engine takes later holds none of them). Entries a shared
        store holds age out."""
        ...

    def measures(self) -> WorkloadMeasures:
        """The workload windows and the in-flight counts the router routes by."""
        ...

    def held_blocks(self) -> Mapping[str, int]:
        """Per endpoint URL, the distinct prompt blocks this process's prefix index holds for
        it, counted as cached now (for scrape-time gauges: may cost O(entries))."""
        ...

    async def aclose(self) -> None: ...
