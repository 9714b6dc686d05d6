"""Endpoints behind a DNS name: a pool marked ``resolve: dns`` is as many endpoints as its
names have addresses, looked up again at every poll.

Algorithm (:meth:`DnsResolver.resolve`, once per poll round for every such pool): each
endpoint URL of the pool names a host; it is looked up (by default the running event loop's
``getaddrinfo``, TCP, bounded by ``timeout_s``) and every address found becomes an endpoint
URL of its own: the same scheme, user info, port (the scheme's default when the URL has none)
and path, the address as the host (an IPv6 address in brackets). Addresses are sorted, so the
pool's order does not move with the DNS server's rotation. A Kubernetes headless Service's name
resolves to one A record per ready pod (``publishNotReadyAddresses`` off), so the pool follows
its Deployment's scale with no change to the fleet file; the registry adds and drains the
endpoints (:meth:`backends.registry.endpoints.EndpointRegistry.set_endpoints`).

Failure (the look-up raises, times out, or finds no address — a headless Service without a
ready pod answers NXDOMAIN): the name keeps the addresses it last resolved to (none if it never
resolved), whose probes then say whether they are up. One WARNING when a name starts failing
and one INFO when it resolves again, never one line per poll.

Parameters: ``lookup`` (host, port → addresses; default :func:`system_lookup`, injected by
tests), ``timeout_s`` (one look-up's bound [s]). The state (every name's last addresses and
whether it is failing) is the instance's; names no pool uses any more are forgotten.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from urllib.parse import urlsplit, urlunsplit

from config.pools import Pool

log = logging.getLogger(__name__)

Lookup = Callable[[str, int], Awaitable[Sequence[str]]]
"""(host, port) → the host's addresses; raises on failure."""

DNS = "dns"
"""The fleet file's ``resolve`` value of a pool resolved at every poll."""
DEFAULT_PORTS = {"http": 80, "https": 443}


async def system_lookup(host: str, port: int) -> list[str]:
    """The addresses of ``host`` for a TCP connection to ``port``, from the event loop's
    ``getaddrinfo`` (the system resolver, in the loop's executor)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def address_url(url: str, address: str) -> str:
    """``url`` with ``address`` as its host, the port made explicit (path kept)."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    host = f"[{address}]" if ":" in address else address
    netloc = f"{userinfo}@" if userinfo else ""
    netloc += f"{host}:{target_port(url)}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, "")).rstrip("/")


def target_port(url: str) -> int:
    """The TCP port ``url`` connects to."""
    parts = urlsplit(url)
    return parts.port or DEFAULT_PORTS.get(parts.scheme, 80)


def _address_key(address: str) -> tuple[int, int, str]:
    """IPv4 before IPv6, each in numeric order; anything unparsable last, by text."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return (9, 0, address)
    return (ip.version, int(ip), address)


class DnsResolver:
    """Resolves the endpoints of ``resolve: dns`` pools (module docstring)."""

    def __init__(self, lookup: Lookup = system_lookup, timeout_s: float = 2.0) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self._lookup = lookup
        self._timeout_s = timeout_s
        self._last: dict[str, tuple[str, ...]] = {}
        self._failing: set[str] = set()

    async def resolve(self, pools: Iterable[Pool]) -> dict[str, tuple[str, ...]]:
        """Pool name → its endpoint URLs now, for every ``resolve: dns`` pool of ``pools``."""
        dns = [p for p in pools if p.resolve == DNS]
        names = {url for p in dns for url in p.endpoint_urls()}
        self.forget(names)
        found = await asyncio.gather(*(self.pool_urls(p) for p in dns))
        return {p.name: urls for p, urls in zip(dns, found, strict=True)}

    async def pool_urls(self, pool: Pool) -> tuple[str, ...]:
        """The URLs of every address of every endpoint of ``pool``, without repeats."""
        found = await asyncio.gather(*(self.urls(url, pool.name)
                                       for url in pool.endpoint_urls()))
        return tuple(dict.fromkeys(u for urls in found for u in urls))

    async def urls(self, url: str, pool: str = "?") -> tuple[str, ...]:
        """One URL per address of ``url``'s host; on failure its last ones (module docstring)."""
        try:
            addresses = await self._addresses(url)
        except Exception as exc:  # noqa: BLE001 - any failure keeps the last known set
            return self._failed(url, pool, _describe(exc))
        if not addresses:
            return self._failed(url, pool, "no address")
        urls = tuple(address_url(url, a) for a in sorted(set(addresses), key=_address_key))
        if url in self._failing:
            self._failing.discard(url)
            log.info("endpoint %s (pool %s) resolves again: %d address(es)",
                     _host(url), pool, len(urls))
        self._last[url] = urls
        return urls

    async def _addresses(self, url: str) -> Sequence[str]:
        host = urlsplit(url).hostname or ""
        async with asyncio.timeout(self._timeout_s):
            return await self._lookup(host, target_port(url))

    def _failed(self, url: str, pool: str, reason: str) -> tuple[str, ...]:
        last = self._last.get(url, ())
        if url not in self._failing:
            self._failing.add(url)
            log.warning("cannot resolve the endpoint %s (pool %s): %s; keeping its %d last "
                        "known address(es) until it resolves again", _host(url), pool, reason,
                        len(last))
        return last

    def forget(self, keep: Iterable[str]) -> None:
        """Drop what is known of every endpoint URL not in ``keep``."""
        keep = set(keep)
        for url in [u for u in self._last if u not in keep]:
            del self._last[url]
        self._failing &= keep


def _host(url: str) -> str:
    """``url``'s host and port, for the log (no credentials)."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{target_port(url)}"


def _describe(exc: Exception) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
