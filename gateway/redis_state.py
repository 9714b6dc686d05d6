"""The router's memory in Redis, shared by every gateway replica: :class:`RedisState`.

Every operation is one call of one Lua script (:mod:`gateway.redis_lua`, which documents the key
layout and the bounds), so each is atomic in Redis and costs one round trip:
``select_and_reserve`` reads the prefix matches, loads, prefix share, output mean and session,
scores the candidates (:mod:`routing.select`), picks one per group and reserves it, all at
once; two gateways receiving a burst together therefore spread it as one gateway would.
``finish`` releases and learns in one call. Time comes from the injected ``clock`` (wall-clock
seconds by default, so that gateways on different hosts agree up to NTP skew), passed into the
script; the contract tests pass their fake clock the same way.

Local mirror: a :class:`routing.memory_state.MemoryState` that learns everything this gateway
reserves and finishes. It serves :meth:`peek` (the pool choice runs on it, with the loads,
prefix share and output mean of the last shared view overlaid), :meth:`measures` (telemetry)
and every call while Redis is down.

Redis failing is routine. Each call has a deadline of ``timeout_s`` (default 250 ms). On an
error or a timeout the call is served by the local mirror, ``on_backend(False)`` is called
(the gateway sets ``ridge_state_backend_up{backend="redis"}`` to 0) and ONE warning is logged;
until a background probe (PING every ``probe_interval_s``) gets an answer, calls go to the
mirror directly, without trying Redis. Reservation ids made in Redis whose release could not
be sent (Redis was down, or a call timed out after the script may have run) are queued (at
most ``max_reservations``) and released when Redis answers again; any that is lost still
expires by itself after ``reservation_ttl_s``. No call raises for Redis's sake.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis
from redis.exceptions import RedisError

from gateway.redis_lua import SCRIPT
from routing.memory_state import Clock, MemoryState, StateLimits
from routing.select import Selection, SelectRequest
from routing.state import LoadCounts, Outcome, Reservation, StateView
from routing.workload import WorkloadMeasures

log = logging.getLogger("ridge.state")

RID_MARK = "r:"  # ids of reservations held in Redis start with it; local ones never do
FAILURES = (RedisError, OSError, TimeoutError, ValueError)


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


def view_of(raw: Mapping[str, Any]) -> StateView:
    """The :class:`StateView` in a ``select`` answer: matches, loads, window sums, session."""
    prompt, matched, output, outputs = raw["w"]
    loads = {url: LoadCounts(int(r), int(t)) for url, (r, t) in _mapping(raw["l"]).items()}
    return StateView(
        matched_blocks={url: int(n) for url, n in _mapping(raw["m"]).items()},
        load=loads,
        prefix_share=matched / prompt if prompt > 0 else None,
        expected_output_tokens=output / outputs if outputs > 0 else None,
        session_endpoint=raw["s"] or None,
    )


class RedisState:
    """A :class:`routing.state.RouterState` in Redis with a local fallback (see the module)."""

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
        self._probe: asyncio.Task[None] | None = None
        self._unreleased: deque[str] = deque(maxlen=limits.max_reservations)
        self._loads: dict[str, LoadCounts] = {}
        self._windows: dict[str, tuple[float | None, float | None]] = {}
        on_backend(True)

    @classmethod
    def from_url(cls, url: str, limits: StateLimits | None = None, *, timeout_s: float = 0.25,
                 max_connections: int = 128, **kwargs: Any) -> RedisState:
        """One connection pool to ``url`` of at most ``max_connections`` (a call beyond waits
        for a free connection, within its deadline); socket timeouts at ``timeout_s``."""
        pool = BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=None, socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s, decode_responses=True)
        return cls(Redis(connection_pool=pool), limits, timeout_s=timeout_s, **kwargs)

    @property
    def up(self) -> bool:
        """Whether calls go to Redis (False: served locally until the probe sees Redis)."""
        return self._up

    @property
    def local(self) -> MemoryState:
        return self._local

    async def start(self) -> None:
        """Check Redis once; when it does not answer, start on local state (and probe)."""
        if not await self._ping():
            self._down("no answer at start-up")

    # --- the protocol -------------------------------------------------------------------

    def peek(self, model: str, block_hashes: Sequence[int], session: str | None,
             endpoints: Sequence[str]) -> StateView:
        view = self._local.peek(model, block_hashes, session, endpoints)
        if not self._up:
            return view
        share, output = self._windows.get(model, (view.prefix_share,
                                                  view.expected_output_tokens))
        return StateView(view.matched_blocks,
                         {u: self._loads.get(u, LoadCounts()) for u in endpoints},
                         share, output, view.session_endpoint)

    async def read(self, model: str, block_hashes: Sequence[int], session: str | None,
                   endpoints: Sequence[str]) -> StateView:
        raw = await self._call(self._select_args(model, block_hashes, session, endpoints, [],
                                                 [], 0, 0, 0))
        if raw is None:
            return await self._local.read(model, block_hashes, session, endpoints)
        return self._remember(model, raw, endpoints)

    async def select_and_reserve(self, request: SelectRequest) -> Selection:
        rids = [self._new_id() for _ in request.groups]
        urls = list(dict.fromkeys([*request.endpoints,
                                   *(c.url for g in request.groups for c in g.candidates)]))
        groups = [{"c": [{"u": c.url, "f": c.in_flight, "q": c.queued} for c in g.candidates],
                   "w": dict(g.weights)} for g in request.groups]
        raw = await self._call(self._select_args(
            request.model, request.block_hashes, request.session, urls, groups, rids,
            request.prompt_tokens, request.block_tokens, request.tokens), rids)
        if raw is None:
            return await self._local.select_and_reserve(request)
        view = self._remember(request.model, raw, urls)
        chosen = tuple(str(u) for u in raw["picks"])
        froms = [_recorded_from(f) for f in raw.get("from") or [-1] * len(chosen)]
        held = tuple(self._held(rid, url, request.tokens, frm, request.block_hashes)
                     for rid, url, frm in zip(rids, chosen, froms, strict=True))
        return Selection(chosen, held, view)

    async def reserve(self, endpoint: str, tokens: int,
                      block_hashes: Sequence[int] = ()) -> Reservation:
        rid, tokens = self._new_id(), max(0, tokens)
        args = {"op": "reserve", "rids": [rid], "url": endpoint, "tok": tokens,
                "h": [str(h) for h in block_hashes]}
        raw = await self._call(args, [rid])
        if raw is None:
            return await self._local.reserve(endpoint, tokens, block_hashes)
        return self._held(rid, endpoint, tokens, _recorded_from(raw.get("from")), block_hashes)

    def _held(self, rid: str, url: str, tokens: int, recorded_from: int | None,
              block_hashes: Sequence[int]) -> Reservation:
        """A shared reservation; its blocks also go into the local mirror (for :meth:`peek`)."""
        self._local.record_blocks(url, block_hashes)
        return Reservation(rid, url, max(0, tokens), recorded_from)

    async def finish(self, reservation: Reservation, outcome: Outcome) -> None:
        shared = reservation.id.startswith(RID_MARK)
        await self._local.finish(reservation, outcome)  # learns; releases a local one
        if not self._up:
            if shared:
                self._unreleased.append(reservation.id)
            return
        args = self._finish_args(reservation, outcome, [reservation.id] if shared else [])
        if await self._call(args) is None and shared:
            self._unreleased.append(reservation.id)

    async def aclose(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
        await self._local.aclose()
        await self._client.aclose()
        await self._client.connection_pool.disconnect()

    # --- telemetry ----------------------------------------------------------------------

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

    def _select_args(self, model: str, hashes: Sequence[int], session: str | None,
                     urls: Sequence[str], groups: list[dict[str, Any]], rids: list[str],
                     prompt: int, block: int, tokens: int) -> dict[str, Any]:
        return {"op": "select", "model": model, "h": [str(h) for h in hashes],
                "session": session or "", "urls": list(urls), "groups": groups, "rids": rids,
                "pt": prompt, "bt": block, "tok": max(0, tokens)}

    def _finish_args(self, reservation: Reservation, outcome: Outcome,
                     rids: list[str]) -> dict[str, Any]:
        prompt = max(0, outcome.prompt_tokens)
        output = outcome.output_tokens
        return {"op": "finish", "rids": rids, "ok": outcome.succeeded, "url": reservation.endpoint,
                "h": [str(h) for h in outcome.block_hashes], "session": outcome.session or "",
                "model": outcome.model, "pt": prompt,
                "mt": min(prompt, max(0, outcome.matched_tokens)),
                "o": output if output is not None and output >= 0 else -1,
                "ff": -1 if reservation.recorded_from is None else reservation.recorded_from}

    async def _call(self, args: dict[str, Any],
                    rids: Sequence[str] = ()) -> dict[str, Any] | None:
        """Run the script; None when Redis is down, failed or too slow (then ``rids``, which
        the script may have reserved, are queued for release)."""
        if not self._up:
            return None
        args.update(p=self._prefix, now=self._clock(), lim=self._lim)
        try:
            async with asyncio.timeout(self._timeout_s):
                raw = await self._script(args=[json.dumps(args)])
            answer: dict[str, Any] = json.loads(raw)
            return answer
        except FAILURES as exc:
            self._unreleased.extend(rids)
            self._down(f"{type(exc).__name__}: {exc}")
            return None

    def _remember(self, model: str, raw: Mapping[str, Any], urls: Sequence[str]) -> StateView:
        view = view_of(raw)
        for url in urls:
            self._loads[url] = view.load_of(url)
        if model in self._windows or len(self._windows) < self._limits.max_models:
            self._windows[model] = (view.prefix_share, view.expected_output_tokens)
        return view

    # --- failure and recovery -----------------------------------------------------------

    def _down(self, why: str) -> None:
        if not self._up:
            return
        self._up = False
        self._on_backend(False)
        log.warning("router state: Redis unavailable (%s); routing on local state until it "
                    "answers again", why)
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
            self._up = True
            pending = list(self._unreleased)
            self._unreleased.clear()
            if pending and await self._call({"op": "release", "rids": pending}, pending) is None:
                continue
            self._on_backend(True)
            log.warning("router state: Redis answers again; sharing routing state again")
            return
