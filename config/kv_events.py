"""A pool's ``kv_events:``: where its engines publish their KV-cache events.

vLLM's and SGLang's ``--kv-events-config`` (:class:`KvEvents`): a ZMQ PUB socket on ``port``,
an optional replay socket on ``replay_port`` (ports 1 to 65535), a ``topic``. Each engine
publishes on its endpoint's host, or, where several engines share a host, at the pool's
explicit ``tcp://HOST:PORT`` ``addresses`` (one per endpoint, ``replay_addresses`` likewise).
:class:`KvEventSource` is one engine's stream, which the gateway subscribes to
(:mod:`backends.kv_events.subscriber`) and decodes in its engine's wire format
(:data:`KV_EVENT_ENGINES`). What needs the whole pool (prefix caching, one address per
endpoint, no shared host without addresses) the pool checks (:mod:`config.pools`). See
docs/fleet-file.md.
"""

from __future__ import annotations

import re
from typing import Annotated, NamedTuple
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from config.engines import Engine
from config.strict import Strict

Port = Annotated[int, Field(ge=1, le=65535)]
TCP_ADDRESS = r"^tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})$"
"""A ZMQ address a subscriber connects to: ``tcp://HOST:PORT`` (an IPv6 host in brackets)."""
TcpAddress = Annotated[str, Field(pattern=TCP_ADDRESS)]

KV_EVENT_ENGINES: frozenset[Engine] = frozenset({Engine.VLLM, Engine.SGLANG})
"""Engines whose KV-cache events ridge decodes: exactly those with a wire format in
:data:`backends.kv_events.wire.WIRE_FORMATS` (a test holds the two equal; vLLM 0.32; SGLang
0.5.23, whose pages may be smaller than ridge's router blocks: :mod:`routing.kv_events.index`
accumulates them)."""


class KvEventSource(NamedTuple):
    """Where one engine publishes its KV-cache events: ``publish``, its PUB socket's address;
    ``replay``, its replay (ROUTER) socket's, None without one; ``topic``, the stream's topic."""

    publish: str
    replay: str | None
    topic: str


def tcp_address(host: str, port: int) -> str:
    """``tcp://host:port``, an IPv6 host in brackets."""
    bare = host.strip("[]")
    return f"tcp://[{bare}]:{port}" if ":" in bare else f"tcp://{bare}:{port}"


class KvEvents(Strict):
    """The engines' KV-cache event streams (``--kv-events-config``, ZMQ): ``port``, the
    PUB socket's port on each engine's host; ``replay_port``, its replay socket's (None = no
    replay: a missed batch then costs the router what it knew of that engine); ``topic``;
    ``addresses`` / ``replay_addresses``: explicit ``tcp://HOST:PORT`` addresses, one per
    endpoint in order, instead of each endpoint's host with the ports (engines sharing a host
    publish on ports of their own; a rendered engine binds ``port`` and ``replay_port`` unless
    given its own, :func:`backends.launch.vllm.engine_event_ports`)."""

    port: Port
    replay_port: Port | None = None
    topic: str = ""
    addresses: list[TcpAddress] | None = None
    replay_addresses: list[TcpAddress] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> KvEvents:
        if self.replay_port == self.port:
            raise ValueError("replay_port must differ from port (two sockets, one port each)")
        if self.replay_addresses is not None and self.addresses is None:
            raise ValueError("replay_addresses go with addresses (one of each per endpoint)")
        for name in ("addresses", "replay_addresses"):
            listed = getattr(self, name) or []
            if len(set(listed)) != len(listed):
                raise ValueError(f"{name}: an address listed twice")
            wrong = [a for a in listed if not 1 <= address_port(a) <= 65535]
            if wrong:
                raise ValueError(f"{name}: {wrong[0]} has no port from 1 to 65535")
        return self

    def source(self, url: str, index: int | None) -> KvEventSource:
        """The stream of the engine at endpoint ``url`` (``index``: its place among the
        pool's endpoints, None for an address a ``resolve: dns`` name resolved to)."""
        if self.addresses is None:
            host = urlsplit(url).hostname
            if not host:
                raise ValueError(f"endpoint {url!r} names no host")
            return KvEventSource(tcp_address(host, self.port), self._replay_on(host), self.topic)
        if index is None:
            raise ValueError(f"{url!r} is not one of the pool's endpoints, whose KV event "
                             "addresses the fleet file lists")
        publish = self.addresses[index]
        replay = (self.replay_addresses[index] if self.replay_addresses is not None
                  else self._replay_on(_address_host(publish)))
        return KvEventSource(publish, replay, self.topic)

    def _replay_on(self, host: str) -> str | None:
        return None if self.replay_port is None else tcp_address(host, self.replay_port)

    def ports(self) -> dict[str, int]:
        """The ports the engines listen on for the streams, by name (``kv-events``,
        ``kv-replay``)."""
        named = {"kv-events": self.port, "kv-replay": self.replay_port}
        return {name: port for name, port in named.items() if port is not None}


def _address_host(address: str) -> str:
    return _address_parts(address).group(1)


def address_port(address: str) -> int:
    """The port of a ``tcp://HOST:PORT`` address."""
    return int(_address_parts(address).group(2))


def _address_parts(address: str) -> re.Match[str]:
    match = re.match(TCP_ADDRESS, address)
    if match is None:
        raise ValueError(f"not a tcp://HOST:PORT address: {address!r}")
    return match
