"""Probing engines over HTTP: health and normalised metrics, behind the MetricsSource seam.

:class:`MetricsSource` is what the registry's poller needs; :class:`HttpProbe` implements it
with one shared ``aiohttp.ClientSession`` and, when given one, ridge's own HTTP/1.1 client
(:class:`backends.upstream.http1.Http1Client`) for ``http://`` endpoints, both owned by the
caller: the lean client spends a fraction of aiohttp's CPU per page, and the poller asks every
endpoint for its health and its metrics once a second by default. Tests inject fakes.
Outcomes, the same for every implementation: ``health`` is True on a 2xx answer, False on any
other, and raises :class:`ProbeError` when the engine cannot be reached; ``metrics`` is the
page normalised by the engine's dialect, or :class:`ProbeError`; ``facts``
(:mod:`backends.engines.facts`) never raises, leaving unknown what it cannot read, and fetches
only the sources the engine's fact table names, when an endpoint becomes healthy.

Parameters: ``timeout_s`` bounds each request end to end; ``max_body_bytes`` the metrics page.
See docs/backends.md#probes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

import aiohttp

from backends.engines.dialects import EngineDialect
from backends.engines.facts import Facts, Pages, Source, fact_table, read_facts
from backends.engines.scrape import MetricsParseError, normalise
from backends.upstream.client import UpstreamError, UpstreamTimeout
from backends.upstream.http1 import Http1Client
from routing.snapshots import EngineMetrics

log = logging.getLogger(__name__)


class ProbeError(Exception):
    """An engine could not be probed. ``url`` is the URL requested (its path says whether
    health or metrics), ``reason`` a short human-readable cause."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{url}: {reason}")
        self.url = url
        self.reason = reason


class MetricsSource(Protocol):
    """Where the poller gets an endpoint's health and metrics from."""

    async def health(self, url: str, dialect: EngineDialect) -> bool:
        """True if the engine says it is healthy; raises ProbeError if unreachable."""
        ...

    async def metrics(self, url: str, dialect: EngineDialect) -> EngineMetrics:
        """The engine's normalised metrics; raises ProbeError on any failure."""
        ...

    async def facts(self, url: str, dialect: EngineDialect) -> Facts:
        """What the engine says about its configuration; unknown facts left out; no raise."""
        ...


NO_HEADERS: Mapping[str, str] = MappingProxyType({})
HeadersFor = Callable[[str], Mapping[str, str]]
"""The headers to send with a probe of an endpoint URL (its engine's API key)."""


def _no_headers(url: str) -> Mapping[str, str]:
    return NO_HEADERS


class HttpProbe:
    """:class:`MetricsSource` over HTTP with a caller-owned aiohttp session, and a caller-owned
    :class:`Http1Client` (``lean``) for ``http://`` URLs when given. ``headers``: per
    endpoint URL, what to send with every probe — an engine started with an API key may guard
    its metrics and server-info pages with it (SGLang guards every path but ``/health``)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        timeout_s: float = 2.0,
        max_body_bytes: int = 16 * 1024 * 1024,
        headers: HeadersFor = _no_headers,
        lean: Http1Client | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self._session = session
        self._timeout_s = timeout_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._max_body_bytes = max_body_bytes
        self._headers = headers
        self._lean = lean

    async def health(self, url: str, dialect: EngineDialect) -> bool:
        target = url.rstrip("/") + dialect.health_path
        status, _ = await self._get(target, self._headers(url), read=False)
        return 200 <= status < 300

    async def metrics(self, url: str, dialect: EngineDialect) -> EngineMetrics:
        target = url.rstrip("/") + dialect.metrics_path
        text = await self._fetch_text(target, self._headers(url))
        try:
            return normalise(text, dialect)
        except MetricsParseError as exc:
            raise ProbeError(target, f"page does not parse: {exc}") from exc

    async def facts(self, url: str, dialect: EngineDialect) -> Facts:
        table = fact_table(dialect.engine)
        base, sources = url.rstrip("/"), table.sources()
        headers = self._headers(url)

        async def nothing() -> None:
            return None

        metrics, info, models = await asyncio.gather(
            self._optional_text(base, dialect.metrics_path, headers)
            if Source.METRICS in sources else nothing(),
            self._first_json(base, table.info_paths, headers)
            if Source.SERVER_INFO in sources else nothing(),
            self._optional_json(base, dialect.models_path, headers)
            if Source.MODELS in sources else nothing(),
        )
        return read_facts(table, Pages(metrics, info, models))

    async def _first_json(self, base: str, paths: tuple[str, ...],
                          headers: Mapping[str, str]) -> dict[str, Any] | None:
        """The first of ``paths`` that answers a JSON object (older engines lack newer paths)."""
        for path in paths:
            found = await self._optional_json(base, path, headers)
            if found is not None:
                return found
        return None

    async def _optional_json(self, base: str, path: str,
                             headers: Mapping[str, str]) -> dict[str, Any] | None:
        text = await self._optional_text(base, path, headers)
        try:
            found = json.loads(text) if text is not None else None
        except ValueError:
            log.debug("%s is not JSON; the facts it holds stay unknown", path)
            return None
        return found if isinstance(found, dict) else None

    async def _optional_text(self, base: str, path: str,
                             headers: Mapping[str, str]) -> str | None:
        try:
            return await self._fetch_text(base + path, headers)
        except ProbeError as exc:
            log.debug("%s: %s; the facts it holds stay unknown", path, exc.reason)
            return None

    async def _fetch_text(self, target: str, headers: Mapping[str, str]) -> str:
        status, body = await self._get(target, headers, read=True)
        if not 200 <= status < 300:
            raise ProbeError(target, f"HTTP {status}")
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            raise ProbeError(target, "page is not UTF-8") from None

    async def _get(self, target: str, headers: Mapping[str, str],
                   read: bool) -> tuple[int, bytes]:
        """``GET target``: the status and, with ``read`` and a 2xx answer, the page (at most
        ``max_body_bytes``); :class:`ProbeError` when it cannot be had within the timeout."""
        if self._lean is not None and target.startswith("http://"):
            return await self._get_lean(self._lean, target, headers, read)
        try:
            async with self._session.get(target, timeout=self._timeout,
                                         headers=headers) as resp:
                if not read or not 200 <= resp.status < 300:
                    return resp.status, b""
                return resp.status, await self._read_bounded(target, resp.content.iter_any())
        except TimeoutError:
            raise ProbeError(target, "timed out") from None
        except aiohttp.ClientError as exc:
            raise ProbeError(target, f"request failed: {_describe(exc)}") from exc

    async def _get_lean(self, client: Http1Client, target: str, headers: Mapping[str, str],
                        read: bool) -> tuple[int, bytes]:
        """:meth:`_get` on ridge's own client. The page is read whatever the answer, so that
        the connection is kept for the next probe (health pages are a few bytes); what is
        left unread is dropped with the connection."""
        try:
            async with asyncio.timeout(self._timeout_s):
                response = await client.get(target, headers)
                try:
                    body = await self._read_bounded(target, response.chunks())
                except BaseException:
                    response.abort()
                    raise
        except (TimeoutError, UpstreamTimeout):
            raise ProbeError(target, "timed out") from None
        except UpstreamError as exc:
            raise ProbeError(target, f"request failed: {exc}") from exc
        return response.status, body if read and 200 <= response.status < 300 else b""

    async def _read_bounded(self, target: str, pieces: AsyncIterator[bytes]) -> bytes:
        chunks: list[bytes] = []
        size = 0
        async for chunk in pieces:
            size += len(chunk)
            if size > self._max_body_bytes:
                raise ProbeError(target, f"page larger than {self._max_body_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)


def _describe(exc: aiohttp.ClientError) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
