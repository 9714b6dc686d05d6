"""Prefill/decode disaggregation: the engine side of vLLM's and SGLang's P/D protocols.

vLLM (NixlConnector): the prefill engine answers a ``do_remote_decode`` request with
``kv_transfer_params`` naming its held KV, which the decode engine fetches by
``remote_engine_id`` and ``remote_request_id`` (unknown or expired: it recomputes the prompt);
held KV is freed when read or after :data:`PREFILL_HOLD_TIMEOUT_S`. SGLang (bootstrap
rendezvous): the same request reaches a prefill and a decode server at once, matched by
``bootstrap_room`` (required by either role, else 400); a decode request whose prefill never
comes is aborted after :data:`DECODE_BOOTSTRAP_TIMEOUT_S`. :data:`PARSERS` reads each protocol.

Transfer time [s] = (prompt tokens − 1 − tokens the decode engine caches) · KV bytes per token ÷
the slower pool's ``kv_link_bandwidth`` [B/s] (:class:`KVTransferHub`, :class:`Link`). Pools
of role ``mixed`` ignore these fields. See docs/simulator.md#pd-hand-off-engine-side.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from backends.sim.clock import Clock
from backends.sim.request import Phase, RemoteKV, SimRequest
from backends.sim.runner import EngineRunner, RequestHandle
from config.engines import Role

PREFILL_HOLD_TIMEOUT_S = 480.0
DECODE_BOOTSTRAP_TIMEOUT_S = 300.0


@dataclass(slots=True)
class KVHandoff:
    """A prefill engine's finished KV, ready to be read."""

    published_at: float
    link_bandwidth: float
    release: Callable[[], None]


class KVTransferHub:
    """Rendezvous of prefill and decode engines in one fleet (owned by the fleet, not global)."""

    def __init__(self) -> None:
        self._by_request: dict[tuple[str, str], KVHandoff] = {}
        self._rooms: dict[int, KVHandoff] = {}
        self._waiters: dict[int, Callable[[KVHandoff], None]] = {}

    def publish_request(self, key: tuple[str, str], handoff: KVHandoff) -> None:
        self._by_request[key] = handoff

    def take_request(self, key: tuple[str, str]) -> KVHandoff | None:
        return self._by_request.pop(key, None)

    def publish_room(self, room: int, handoff: KVHandoff) -> None:
        waiter = self._waiters.pop(room, None)
        if waiter is not None:
            waiter(handoff)
        else:
            self._rooms[room] = handoff

    def await_room(self, room: int, callback: Callable[[KVHandoff], None]) -> None:
        handoff = self._rooms.pop(room, None)
        if handoff is not None:
            callback(handoff)
        else:
            self._waiters[room] = callback

    def forget(self, key: tuple[str, str] | int) -> None:
        if isinstance(key, tuple):
            self._by_request.pop(key, None)
        else:
            self._rooms.pop(key, None)
            self._waiters.pop(key, None)


@dataclass(frozen=True, slots=True)
class Intent:
    """What a request asks of this engine's KV connector. ``key`` names the KV: (engine id,
    request id) for vLLM's decode side, the bootstrap room for SGLang, None for vLLM's prefill."""

    side: Literal["prefill", "decode"]
    key: tuple[str, str] | int | None


class PDProtocolError(ValueError):
    """The request cannot be served by this P/D role."""


def _parse_nixl(body: Mapping[str, Any], role: Role) -> Intent | None:
    params = body.get("kv_transfer_params")
    if role is Role.MIXED or not isinstance(params, dict):
        return None
    if params.get("do_remote_decode"):
        return Intent("prefill", None)
    if params.get("do_remote_prefill"):
        key = (str(params.get("remote_engine_id")), str(params.get("remote_request_id")))
        return Intent("decode", key)
    return None


def _parse_bootstrap(body: Mapping[str, Any], role: Role) -> Intent | None:
    if role is Role.MIXED:
        return None
    room = body.get("bootstrap_room")
    if not isinstance(room, int) or isinstance(room, bool):
        raise PDProtocolError(f"a {role.value} server needs an integer bootstrap_room")
    return Intent("prefill" if role is Role.PREFILL else "decode", room)


PARSERS: Mapping[str, Callable[[Mapping[str, Any], Role], Intent | None]] = MappingProxyType(
    {"kv_transfer_params": _parse_nixl, "bootstrap": _parse_bootstrap}
)


@dataclass(frozen=True, slots=True)
class Link:
    """Where this engine is and how fast it moves KV [B/s]."""

    engine_id: str
    host: str
    port: int
    bandwidth: float


class PDAgent:
    """One engine's KV connector: prepares P/D requests and publishes or fetches their KV."""

    def __init__(self, hub: KVTransferHub, runner: EngineRunner, clock: Clock, link: Link) -> None:
        self.hub = hub
        self.runner = runner
        self.clock = clock
        self.link = link

    def prepare(self, req: SimRequest, intent: Intent | None) -> None:
        """Set ``req`` up for its side of the protocol (before it is submitted)."""
        if intent is None:
            return
        if intent.side == "prefill":
            req.hold_kv = True
            req.on_finish = lambda r: self._publish(r, intent)
        elif isinstance(intent.key, tuple):
            self._fetch_by_request(req, intent.key)
        else:
            req.remote = RemoteKV(link_bandwidth=self.link.bandwidth)

    def watch(self, handle: RequestHandle, intent: Intent | None) -> None:
        """After submitting: a bootstrap decode request starts waiting for its room's KV."""
        if intent is None or intent.side != "decode" or not isinstance(intent.key, int):
            return
        room = intent.key
        loop = asyncio.get_running_loop()
        timer = loop.call_later(
            self.clock.real_seconds(DECODE_BOOTSTRAP_TIMEOUT_S), self._give_up, handle, room
        )

        def landed(h: KVHandoff) -> None:
            timer.cancel()
            self._landed(handle.request, h)

        self.hub.await_room(room, landed)

    def transfer_params(self, req: SimRequest) -> dict[str, Any]:
        """vLLM's ``kv_transfer_params`` answer of a prefill engine for finished ``req``."""
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": list(self.runner.core.held.get(req.rid, [])),
            "remote_engine_id": self.link.engine_id,
            "remote_request_id": req.rid,
            "remote_host": self.link.host,
            "remote_port": self.link.port,
            "tp_size": 1,
        }

    def _publish(self, req: SimRequest, intent: Intent) -> None:
        if req.final_reason == "abort" or req.finished_at is None:
            return
        key: tuple[str, str] | int = (
            intent.key if intent.key is not None else (self.link.engine_id, req.rid)
        )
        release = self._releaser(req.rid, key)
        handoff = KVHandoff(req.finished_at, self.link.bandwidth, release)
        if isinstance(key, tuple):
            self.hub.publish_request(key, handoff)
        else:
            self.hub.publish_room(key, handoff)

    def _releaser(self, rid: str, key: tuple[str, str] | int) -> Callable[[], None]:
        loop = asyncio.get_running_loop()
        done = False

        def release() -> None:
            nonlocal done
            if not done:
                done = True
                timer.cancel()
                self.hub.forget(key)
                self.runner.release_held(rid)

        timer = loop.call_later(self.clock.real_seconds(PREFILL_HOLD_TIMEOUT_S), release)
        return release

    def _fetch_by_request(self, req: SimRequest, key: tuple[str, str]) -> None:
        handoff = self.hub.take_request(key)
        if handoff is None:
            return
        req.remote = RemoteKV(
            link_bandwidth=min(self.link.bandwidth, handoff.link_bandwidth),
            published_at=handoff.published_at,
            release=handoff.release,
        )

    def _landed(self, req: SimRequest, handoff: KVHandoff) -> None:
        if req.remote is None or req.phase is Phase.FINISHED:
            handoff.release()  # the decode request is gone: the prefill engine may free its KV
            return
        req.remote.release = handoff.release
        req.remote.link_bandwidth = min(req.remote.link_bandwidth, handoff.link_bandwidth)
        self.runner.core.kv_published(req, handoff.published_at, self.clock.now())
        self.runner.wake()

    def _give_up(self, handle: RequestHandle, room: int) -> None:
        self.hub.forget(room)
        self.runner.fail(handle)
