"""The router's memory in Redis, shared by every gateway replica: :class:`RedisState`.

Every operation is one call of one Lua script (:mod:`gateway.state.redis_script`), atomic in
Redis and one round trip; the routing decision stays in Python. :meth:`RedisState.place`
reads the view, runs ``choose`` on it (with this gateway's pending choices added) and reserves
on condition no chosen endpoint gained more in-flight requests than the one that gained fewest;
refused, it chooses again on the fresh view returned, the :data:`ATTEMPTS`-th unconditionally.

A local :class:`routing.state.memory.MemoryState` mirrors this gateway's reservations and
learning and serves every call while Redis is down. No call raises for Redis's sake: calls
have a deadline (``timeout_s``), :data:`SLOW_LIMIT` late calls in a row or any error are an
outage (``on_backend(False)``, one warning, a PING probe until Redis answers), and releases
that could not be sent are queued. Start-up: :func:`check_redis` classifies one PING
(:class:`RedisCheck`); :class:`RedisUnavailable` when Redis is required.
See docs/redis-state.md.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import socket
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from redis.asyncio import BlockingConnectionPool, Redis
from redis.exceptions import AuthenticationError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.state.redis_script import SCRIPT
from routing.load import NO_LOAD, InFlight, LoadCounts
from routing.prefix_index import KeyLayout
from routing.state.memory import Clock, MemoryState, StateLimits
from routing.state.protocol import Ask, C, Outcome, Placed, Reservation, StateView
from routing.window import WorkloadMeasures

log = logging.getLogger("ridge.state")

RID_MARK = "r:"  # ids of reservations held in Redis start with it; local ones never do
FAILURES = (RedisError, OSError, TimeoutError, ValueError)
SLOW = (TimeoutError, RedisTimeoutError)
SLOW_LIMIT = 3  # slow calls in a row that count as an outage
ATTEMPTS = 6  # choices per request; the last one is reserved unconditionally


def _limits_arg(limits: StateLimits) -> list[float]:
    return [limits.max_prefix_entries, limits.prefix_max_age_s, limits.max_sessions,
            limits.session_max_age_s, limits.reservation_ttl_s, limits.max_reservations,
            limits.window_requests, limits.max_models]


def _mapping(raw: Any) -> Mapping[str, Any]:
    """cjson encodes an empty table as ``{}`` or ``[]``: both mean empty here."""
    return raw if isinstance(raw, dict) else {}


def _recorded_from(raw: Any) -> int | None:
    """The script's ``from`` (−1 or absent: nothing recorded) as ``Reservation.recorded_from``."""
    return None if raw is None or int(raw) < 0 else int(raw)


def view_of(raw: Mapping[str, Any], layout: KeyLayout, blocks: int) -> StateView:
    """The :class:`StateView` in a ``read`` answer: matches (keys of a chain of ``blocks``
    blocks, as blocks through ``layout``), loads, window sums, session."""
    prompt, matched, _, _ = raw["w"]
    loads = {url: LoadCounts(int(r), int(t)) for url, (r, t) in _mapping(raw["l"]).items()}
    return StateView(
        matched_blocks={url: layout.blocks(int(n), blocks)
                        for url, n in _mapping(raw["m"]).items()},
        load=loads,
        prefix_share=matched / prompt if prompt > 0 else None,
        session_endpoint=raw["s"] or None,
    )


def output_mean(raw: Mapping[str, Any]) -> float | None:
    """The model's mean output length [tokens] in a ``read`` answer's window sums."""
    _, _, output, outputs = raw["w"]
    return output / outputs if outputs > 0 else None


# --- the start-up check ------------------------------------------------------------------

AUTH_CODES = ("WRONGPASS", "NOAUTH")  # Redis's error codes for refused credentials
CheckOutcome = Literal["ok", "auth", "unreachable", "error"]


class RedisUnavailable(Exception):
    """Redis failed the start-up check and is required (``state.redis_required``): ridge does
    not start. The message names Redis by ``host:port/db`` and says why; never credentials."""


@dataclass(frozen=True, slots=True)
class RedisCheck:
    """The start-up check of the Redis at ``where`` (``host:port/db``): its ``outcome`` and,
    when it failed, the ``cause`` (e.g. ``connection refused``), free of credentials."""

    where: str
    outcome: CheckOutcome
    cause: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    @property
    def level(self) -> int:
        """The log level of the failure: unreachable is a warning (it may be on its way up);
        refused credentials and other errors are errors (a configuration to fix)."""
        return logging.WARNING if self.outcome == "unreachable" else logging.ERROR

    def problem(self) -> str:
        """What happened, as a sentence starting with ``Redis at <where>``."""
        what = {"ok": "answered", "auth": "refused the credentials",
                "unreachable": "unreachable", "error": "failed the start-up check"}
        return f"Redis at {self.where} {what[self.outcome]} ({self.cause})" if self.cause \
            else f"Redis at {self.where} {what[self.outcome]}"

    def serving_line(self) -> str:
        """The line logged when ridge starts anyway, on local state."""
        until = "accepts them" if self.outcome == "auth" else "answers"
        return f"{self.problem()}; serving with local state until it {until}"

    def refusal(self) -> RedisUnavailable:
        """The exception that stops ridge when Redis is required."""
        return RedisUnavailable(f"{self.problem()}; RIDGE_STATE__REDIS_REQUIRED is set, so "
                                "ridge does not start without it")


def redis_address(client: Redis) -> str:
    """Where ``client`` connects, as ``host:port/db`` (``unix:path/db``): never credentials."""
    kwargs = client.connection_pool.connection_kwargs
    db = kwargs.get("db", 0)
    if kwargs.get("path"):
        return f"unix:{kwargs['path']}/{db}"
    host = str(kwargs.get("host", "localhost"))
    return f"[{host}]:{kwargs.get('port', 6379)}/{db}" if ":" in host \
        else f"{host}:{kwargs.get('port', 6379)}/{db}"


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling (redis-py wraps the
    socket's error)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _redacted(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


def _unreachable_cause(exc: BaseException, timeout_s: float) -> str | None:
    """Why Redis could not be reached; None when it was reached (it answered an error)."""
    for cause in _causes(exc):
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, socket.gaierror):
            return "host name not resolved"
        if isinstance(cause, SLOW):
            return f"no answer within {timeout_s:g} s, {SLOW_LIMIT} tries"
    if not isinstance(exc, (RedisConnectionError, OSError)):
        return None
    errors = [c for c in _causes(exc) if isinstance(c, OSError) and c.strerror]
    return str(errors[0].strerror).lower() if errors else (str(exc) or type(exc).__name__)


def classify(exc: BaseException, *, password: str | None = None,
             timeout_s: float = 0.25) -> RedisCheck:
    """The failed start-up check that ``exc`` (raised by a PING) means, with ``where`` left
    empty; ``password`` (the client's) decides the wording and is never in the cause."""
    text = _redacted(str(exc), password)
    if isinstance(exc, AuthenticationError) or (
            isinstance(exc, ResponseError) and text.upper().startswith(AUTH_CODES)):
        given = "wrong password or user" if password else "no password given; it requires one"
        return RedisCheck("", "auth", given)
    unreachable = _unreachable_cause(exc, timeout_s)
    if unreachable is not None:
        return RedisCheck("", "unreachable", _redacted(unreachable, password))
    return RedisCheck("", "error", f"{type(exc).__name__}: {text}" if text
                      else type(exc).__name__)


async def check_redis(client: Redis, timeout_s: float) -> RedisCheck:
    """PING ``client``'s Redis once, classified (:func:`classify`). An error decides at once; a
    late answer (past ``timeout_s``, at least 0.2 s) is tried again, up to :data:`SLOW_LIMIT`
    in a row: one late answer is not an outage."""
    where = redis_address(client)
    failure: BaseException = TimeoutError()
    for _ in range(SLOW_LIMIT):
        try:
            async with asyncio.timeout(max(timeout_s, 0.2)):
                await client.ping()
            return RedisCheck(where, "ok")
        except FAILURES as exc:
            failure = exc
            if not isinstance(exc, SLOW):
                break
    password = client.connection_pool.connection_kwargs.get("password")
    found = classify(failure, password=password, timeout_s=max(timeout_s, 0.2))
    return replace(found, where=where)


def redis_client(url: str, *, timeout_s: float = 0.25, max_connections: int = 128) -> Redis:
    """A client of one connection pool to ``url`` of at most ``max_connections`` (a call beyond
    waits for a free connection, within its deadline); socket timeouts at ``timeout_s``."""
    pool = BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=None, socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s, decode_responses=True)
    return Redis(connection_pool=pool)


async def check_url(url: str, timeout_s: float = 0.25) -> RedisCheck:
    """:func:`check_redis` on a connection of its own to ``url``, closed after."""
    client = redis_client(url, timeout_s=timeout_s, max_connections=1)
    try:
        return await check_redis(client, timeout_s)
    finally:
        await client.aclose()
        await client.connection_pool.disconnect()


class RedisState:
    """A :class:`routing.state.protocol.RouterState` in Redis with a local fallback (see the
    module)."""

    finishes_at_once = False  # finish releases in Redis

    def __init__(self, client: Redis, limits: StateLimits | None = None, *,
                 prefix: str = "ridge:", timeout_s: float = 0.25, probe_interval_s: float = 1.0,
                 clock: Clock = time.time,
                 on_backend: Callable[[bool], None] = lambda up: None) -> None:
        self._client = client
        self._limits = limits = limits or StateLimits()
        self._prefix, self._timeout_s, self._probe_s = prefix, timeout_s, probe_interval_s
        self._clock, self._on_backend = clock, on_backend
        self._script = client.register_script(SCRIPT)
        self._local = MemoryState(limits, clock=clock)
        self._lim = _limits_arg(limits)
        self._ids = itertools.count(1)
        self._rid = f"{RID_MARK}{uuid.uuid4().hex[:12]}-"
        self._up = True
        self._slow = 0  # slow calls in a row
        self._probe: asyncio.Task[None] | None = None
        self._unreleased: deque[str] = deque(maxlen=limits.max_reservations)
        self._loads: dict[str, LoadCounts] = {}
        self._outputs: dict[str, float | None] = {}
        self._pending: Counter[str] = Counter()
        on_backend(True)

    @classmethod
    def from_url(cls, url: str, limits: StateLimits | None = None, *, timeout_s: float = 0.25,
                 max_connections: int = 128, **kwargs: Any) -> RedisState:
        """A state on :func:`redis_client` ``(url, ...)``."""
        client = redis_client(url, timeout_s=timeout_s, max_connections=max_connections)
        return cls(client, limits, timeout_s=timeout_s, **kwargs)

    @property
    def up(self) -> bool:
        """Whether calls go to Redis (False: served locally until the probe sees Redis)."""
        return self._up

    @property
    def local(self) -> MemoryState:
        return self._local

    @property
    def client(self) -> Redis:
        """The Redis client (one connection pool), for the other shared records: API keys
        and rate limits."""
        return self._client

    async def start(self, *, required: bool = False) -> RedisCheck:
        """Check Redis once (:func:`check_redis`) and return the outcome. Failed: one line is
        logged (:meth:`RedisCheck.serving_line`) and the state starts on local state, probing
        until Redis answers; or, when ``required``, :class:`RedisUnavailable` is raised (the
        caller closes the state)."""
        check = await check_redis(self._client, self._timeout_s)
        if check.ok:
            return check
        if required:
            raise check.refusal()
        log.log(check.level, "%s", check.serving_line())
        self._go_down()
        return check

    # --- the protocol -------------------------------------------------------------------

    def learned_output(self, model: str) -> float | None:
        shared = self._outputs.get(model) if self._up else None
        return shared if shared is not None else self._local.learned_output(model)

    async def read(self, ask: Ask) -> StateView:
        raw = await self._call(self._args("read", ask))
        if raw is None:
            return await self._local.read(ask)
        return self._remember(ask, raw)

    async def place(self, ask: Ask, choose: Callable[[StateView], C | None]) -> Placed[C] | None:
        """Read, choose, reserve on condition; choose again on a refusal (module docstring)."""
        raw = await self._call(self._args("read", ask))
        if raw is None:
            return await self._local.place(ask, choose)
        view = self._remember(ask, raw)
        for attempt in range(ATTEMPTS):
            seen = self._with_pending(view)
            choice = choose(seen)
            if choice is None:
                return None
            raw = await self._reserve(ask, choice.urls, seen, attempt == ATTEMPTS - 1)
            if raw is None:
                return await self._local.place(ask, choose)
            if raw.get("ok"):
                return Placed(choice, self._held(ask, choice.urls, raw), seen)
            view = self._remember(ask, raw)
        raise AssertionError("unreachable: the last attempt is forced")

    def _with_pending(self, view: StateView) -> StateView:
        """``view`` with this gateway's reservations still on their way added to its loads."""
        if not self._pending:
            return view
        load = dict(view.load)
        for url, n in self._pending.items():
            held = load.get(url, NO_LOAD)
            load[url] = LoadCounts(held.requests + n, held.tokens)
        return view.replaced(load=load)

    async def _reserve(self, ask: Ask, urls: tuple[str, ...], seen: StateView,
                       force: bool) -> dict[str, Any] | None:
        """The conditional ``reserve`` call (None: Redis failed); ``urls`` count as pending
        meanwhile."""
        rids = [self._new_id() for _ in urls]
        args = self._args("reserve", ask, picks=list(urls), rids=rids, force=force,
                          expect=[seen.load_of(u).requests for u in urls],
                          seen=[seen.load_of(u).requests for u in ask.endpoints])
        self._pending.update(urls)
        try:
            raw = await self._call(args, rids)
        finally:
            self._pending.subtract(urls)
            for url in urls:
                if self._pending[url] <= 0:
                    del self._pending[url]
        if raw is not None:
            raw["rids"] = rids
        return raw

    def _held(self, ask: Ask, urls: Sequence[str],
              raw: Mapping[str, Any]) -> tuple[Reservation, ...]:
        """The shared reservations, mirrored locally under the same ids (own in-flight count,
        blocks for the fallback)."""
        froms = [_recorded_from(f) for f in raw.get("from") or [-1] * len(urls)]
        layout, blocks = self._local.prefix_layout, len(ask.block_hashes)
        held = []
        for rid, url, frm in zip(raw["rids"], urls, froms, strict=True):
            self._local.hold(url, ask.tokens, ask.block_hashes, rid)
            held.append(Reservation(rid, url, max(0, ask.tokens),
                                    None if frm is None else layout.blocks(frm, blocks)))
        return tuple(held)

    async def finish(self, reservation: Reservation, outcome: Outcome) -> None:
        shared = reservation.id.startswith(RID_MARK)
        await self._local.finish(reservation, outcome)  # learns; releases the local copy
        if not self._up:
            if shared:
                self._unreleased.append(reservation.id)
            return
        args = self._finish_args(reservation, outcome, [reservation.id] if shared else [])
        if await self._call(args) is None and shared:
            self._unreleased.append(reservation.id)

    def forget_endpoint(self, url: str) -> None:
        self._local.forget_endpoint(url)

    async def aclose(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
        await self._local.aclose()
        await self._client.aclose()
        await self._client.connection_pool.disconnect()

    # --- telemetry ----------------------------------------------------------------------

    def in_flight(self) -> InFlight:
        """This gateway's own reservations (mirrored locally)."""
        return self._local.in_flight()

    def held_blocks(self) -> Mapping[str, int]:
        """The prompt blocks per endpoint of this gateway's local prefix index (its own
        traffic's share; the shared index's is not read at scrape time)."""
        return self._local.held_blocks()

    def measures(self) -> WorkloadMeasures:
        """This gateway's window measures; in-flight counts: the last shared ones seen."""
        local = self._local.measures()
        if not self._up:
            return local
        return WorkloadMeasures(local.window, local.overall, local.by_model,
                                {u: c for u, c in self._loads.items() if c.requests})

    # --- Redis calls --------------------------------------------------------------------

    def _new_id(self) -> str:
        return f"{self._rid}{next(self._ids)}"

    def _args(self, op: str, ask: Ask, **extra: Any) -> dict[str, Any]:
        keys = self._local.prefix_layout.keys(ask.block_hashes)
        return {"op": op, "model": ask.model, "h": [str(h) for h in keys],
                "session": ask.session or "", "urls": list(ask.endpoints),
                "tok": max(0, ask.tokens), **extra}

    def _finish_args(self, reservation: Reservation, outcome: Outcome,
                     rids: list[str]) -> dict[str, Any]:
        prompt = max(0, outcome.prompt_tokens)
        output = outcome.output_tokens
        layout, frm, blocks = (self._local.prefix_layout, reservation.recorded_from,
                               len(outcome.block_hashes))
        return {"op": "finish", "rids": rids, "ok": outcome.succeeded, "url": reservation.endpoint,
                "h": [str(h) for h in layout.keys(outcome.block_hashes)],
                "session": outcome.session or "",
                "model": outcome.model, "pt": prompt,
                "mt": min(prompt, max(0, outcome.matched_tokens)),
                "o": output if output is not None and output >= 0 else -1,
                "ff": -1 if frm is None else layout.first_key(frm, blocks)}

    async def _call(self, args: dict[str, Any],
                    rids: Sequence[str] = ()) -> dict[str, Any] | None:
        """Run the script; None when Redis is down, failed or too slow (then ``rids``, which
        the script may have reserved, are queued for release)."""
        if not self._up:
            return None
        return await self._run(args, rids)

    async def _run(self, args: dict[str, Any], rids: Sequence[str]) -> dict[str, Any] | None:
        """:meth:`_call` whether or not Redis is marked up (the probe releases through it)."""
        args.update(p=self._prefix, now=self._clock(), lim=self._lim)
        try:
            async with asyncio.timeout(self._timeout_s):
                raw = await self._script(args=[json.dumps(args)])
            answer: dict[str, Any] = json.loads(raw)
        except FAILURES as exc:
            self._unreleased.extend(rids)
            self._slow = self._slow + 1 if isinstance(exc, SLOW) else SLOW_LIMIT
            if self._slow >= SLOW_LIMIT:
                self._down(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
            return None
        self._slow = 0
        return answer

    def _remember(self, ask: Ask, raw: Mapping[str, Any]) -> StateView:
        """The view in ``raw``; its loads and the model's output mean are kept (telemetry,
        :meth:`learned_output`)."""
        view = view_of(raw, self._local.prefix_layout, len(ask.block_hashes))
        for url in ask.endpoints:
            self._loads[url] = view.load.get(url, NO_LOAD)
        if ask.model in self._outputs or len(self._outputs) < self._limits.max_models:
            self._outputs[ask.model] = output_mean(raw)
        return view

    # --- failure and recovery -----------------------------------------------------------

    def _down(self, why: str) -> None:
        """An outage seen by a call: one warning, then local state until the probe sees Redis."""
        if not self._up:
            return
        log.warning("router state: Redis unavailable (%s); routing on local state until it "
                    "answers again", why)
        self._go_down()

    def _go_down(self) -> None:
        """Calls go to local state; the backend is reported down; the probe runs."""
        if not self._up:
            return
        self._up = False
        self._on_backend(False)
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._recover())

    async def _ping(self) -> bool:
        try:
            async with asyncio.timeout(max(self._timeout_s, 0.2)):
                return bool(await self._client.ping())
        except FAILURES:
            return False

    async def _recover(self) -> None:
        while True:
            await asyncio.sleep(self._probe_s)
            if not await self._ping():
                continue
            # the pool's idle connections date from before the outage: a restarted server
            # closed them, and each would fail the first call made on it
            await self._client.connection_pool.disconnect(inuse_connections=False)
            pending = list(self._unreleased)
            self._unreleased.clear()
            if pending and await self._run({"op": "release", "rids": pending}, pending) is None:
                continue
            # up and reported in one step: no caller sees the state up but not yet reported
            self._up, self._slow = True, 0
            self._on_backend(True)
            log.warning("router state: Redis answers again; sharing routing state again")
            return
