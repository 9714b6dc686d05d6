"""Probing engines over HTTP: health and normalised metrics, behind the MetricsSource seam.

:class:`MetricsSource` is what the registry's poller needs; :class:`HttpProbe` implements it
with one shared ``aiohttp.ClientSession`` (owned by the caller, so connections are pooled and
closed in one place). Tests inject fakes instead.

Outcomes, the same for every implementation:
- ``health`` returns True when the engine answers its health path with a 2xx status and False
  when it answers anything else (it is up but says it is not ready); it raises
  :class:`ProbeError` when it cannot be reached (connect error, timeout).
- ``metrics`` returns the page normalised by the engine's dialect, or raises
  :class:`ProbeError` on connect error, timeout, non-2xx status, an oversized or undecodable
  body, or a page that does not parse.

Parameters: ``timeout_s`` bounds each request end to end (connect, headers and body);
``max_body_bytes`` bounds the metrics page read into memory.
"""

from __future__ import annotations

from typing import Protocol

import aiohttp

from backends.dialects import EngineDialect
from backends.metrics import MetricsParseError, normalise
from routing.snapshots import EngineMetrics


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


class HttpProbe:
    """:class:`MetricsSource` over HTTP with a caller-owned aiohttp session."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        timeout_s: float = 2.0,
        max_body_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._max_body_bytes = max_body_bytes

    async def health(self, url: str, dialect: EngineDialect) -> bool:
        target = url.rstrip("/") + dialect.health_path
        try:
            async with self._session.get(target, timeout=self._timeout) as resp:
                return 200 <= resp.status < 300
        except TimeoutError:
            raise ProbeError(target, "timed out") from None
        except aiohttp.ClientError as exc:
            raise ProbeError(target, f"request failed: {_describe(exc)}") from exc

    async def metrics(self, url: str, dialect: EngineDialect) -> EngineMetrics:
        target = url.rstrip("/") + dialect.metrics_path
        text = await self._fetch_text(target)
        try:
            return normalise(text, dialect)
        except MetricsParseError as exc:
            raise ProbeError(target, f"page does not parse: {exc}") from exc

    async def _fetch_text(self, target: str) -> str:
        try:
            async with self._session.get(target, timeout=self._timeout) as resp:
                if not 200 <= resp.status < 300:
                    raise ProbeError(target, f"HTTP {resp.status}")
                body = await self._read_bounded(target, resp)
        except TimeoutError:
            raise ProbeError(target, "timed out") from None
        except aiohttp.ClientError as exc:
            raise ProbeError(target, f"request failed: {_describe(exc)}") from exc
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            raise ProbeError(target, "page is not UTF-8") from None

    async def _read_bounded(self, target: str, resp: aiohttp.ClientResponse) -> bytes:
        chunks: list[bytes] = []
        size = 0
        async for chunk in resp.content.iter_any():
            size += len(chunk)
            if size > self._max_body_bytes:
                raise ProbeError(target, f"page larger than {self._max_body_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)


def _describe(exc: aiohttp.ClientError) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
