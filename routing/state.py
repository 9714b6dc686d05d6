"""Everything the router remembers, behind one small async interface.

The router never keeps memory of its own: the prefix index (which endpoint recently served
which prompt blocks), in-flight requests and tokens per endpoint, the prefix-share window and
the learned output lengths, and session affinity all live behind :class:`RouterState`. The
in-memory implementation (:mod:`routing.memory_state`) serves one gateway; a Redis one lets
many gateway replicas route as one. Both pass the same contract test suite.

On the hot path a request costs two calls: :meth:`RouterState.read` (everything the policy and
the scheduler need, in one read) and :meth:`RouterState.reserve` (count the request on the
chosen endpoint) — or ONE: :meth:`RouterState.select_and_reserve` picks the replica with the
state's own copy of the scheduler's scoring (:mod:`routing.select`) and reserves it in the same
atomic step, so gateways sharing a state cannot herd onto the endpoint they all saw idle; the
pool is chosen beforehand on :meth:`RouterState.peek`, a view from the process's own memory
without I/O. A reservation also records the request's prompt blocks as held by the chosen
endpoint at once — the engine caches them as soon as it prefills, and requests that share a
prompt often arrive together, long before the first one finishes — so the next request
sharing them finds them there. :meth:`RouterState.finish` releases the reservation and records
what was learned (the blocks again, refreshed; prefix share, output length); when the request
failed, it forgets the blocks its reservation added. Reservations expire on their own after
``ttl_s`` so a crashed gateway cannot hold them forever.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from routing.select import Selection, SelectRequest


@dataclass(frozen=True, slots=True)
class LoadCounts:
    """What the gateways have in flight on one endpoint: requests, and tokens (prompt tokens
    still to prefill + output tokens still to decode, as estimated at reservation)."""

    requests: int = 0
    tokens: int = 0


@dataclass(frozen=True, slots=True)
class StateView:
    """One read of the router's memory for one request.

    ``matched_blocks``: per endpoint URL, how many leading prompt blocks it probably holds
    (only endpoints with at least one). ``load``: gateway in-flight counts per endpoint URL
    (missing = none). ``prefix_share``: the recent fraction of prompt tokens that matched
    somewhere, for the request's model, in [0, 1] (None before any observation).
    ``expected_output_tokens``: the learned mean output length for the model (None = unknown).
    ``session_endpoint``: the endpoint this request's session last used, if any.
    """

    matched_blocks: Mapping[str, int] = field(default_factory=dict)
    load: Mapping[str, LoadCounts] = field(default_factory=dict)
    prefix_share: float | None = None
    expected_output_tokens: float | None = None
    session_endpoint: str | None = None

    def load_of(self, url: str) -> LoadCounts:
        return self.load.get(url, LoadCounts())


@dataclass(frozen=True, slots=True)
class Reservation:
    """A request counted on an endpoint; hand it back to ``finish``. ``recorded_from``: the
    first of the request's prompt blocks the reservation recorded on ``endpoint`` that it did
    not hold before (None: it recorded none), forgotten again if the request fails."""

    id: str
    endpoint: str
    tokens: int
    recorded_from: int | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one finished request taught the router."""

    model: str
    block_hashes: Sequence[int]
    prompt_tokens: int
    matched_tokens: int
    output_tokens: int | None
    session: str | None
    succeeded: bool


class RouterState(Protocol):
    """The router's memory. All methods are coroutines; implementations must not raise on the
    hot path for their own failures (a Redis outage falls back to local state)."""

    async def read(
        self, model: str, block_hashes: Sequence[int], session: str | None,
        endpoints: Sequence[str],
    ) -> StateView:
        """Prefix matches, loads of ``endpoints``, prefix share and output estimate for
        ``model``, and the session's endpoint, in one read."""
        ...

    def peek(
        self, model: str, block_hashes: Sequence[int], session: str | None,
        endpoints: Sequence[str],
    ) -> StateView:
        """Like :meth:`read` but from this process's memory, without I/O (the in-memory state:
        the same as ``read``; a shared state: its local mirror, possibly one request stale)."""
        ...

    async def select_and_reserve(self, request: SelectRequest) -> Selection:
        """Read, pick one endpoint per group (:func:`routing.select.pick`), reserve it and
        record the request's blocks there, atomically: no other reservation lands between
        this call's read and its reserve."""
        ...

    async def reserve(self, endpoint: str, tokens: int,
                      block_hashes: Sequence[int] = ()) -> Reservation:
        """Count one request of ``tokens`` on ``endpoint`` until ``finish`` or expiry, and
        record its prompt blocks ``block_hashes`` as held there."""
        ...

    async def finish(self, reservation: Reservation, outcome: Outcome) -> None:
        """Release ``reservation``; on success remember the blocks as cached on its endpoint,
        bind the session to it, and feed the prefix-share window and output estimate; on
        failure forget the blocks the reservation recorded (from ``recorded_from`` on)."""
        ...

    async def aclose(self) -> None: ...
