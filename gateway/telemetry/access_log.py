"""One access-log line per request on an engine route, for an operator to search.

With ``RIDGE_ACCESS_LOG=true`` the proxy hands :meth:`AccessLog.write` each finished request:
its id (``x-request-id``), the key's name (never the key; ``-`` without keys), the API path,
model, pool, lever, endpoint, HTTP status, TTFT (streams) or time to the engine's headers
(whole answers) and the duration, in milliseconds. ``text`` writes ``name=value`` pairs,
``json`` one JSON object, on the ``ridge.access`` logger at INFO. uvicorn's own access line
(``uvicorn.access``) is kept for the other routes only (:class:`NotProxied`), so a request
is logged once. See docs/telemetry.md#access-log.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from typing import Literal

from gateway.telemetry.prometheus import RequestRecord

FORMATS = ("text", "json")
log = logging.getLogger("ridge.access")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


class AccessLog:
    """Writes the access line of each finished engine-route request in ``fmt``."""

    def __init__(self, fmt: Literal["text", "json"] = "text") -> None:
        self._json = fmt == "json"

    def write(self, record: RequestRecord, request_id: str, key: str | None,
              path: str) -> None:
        fields = {"request_id": request_id, "key": key or "-", "path": path,
                  "model": record.model or "-", "pool": record.pool,
                  "lever": record.lever or "-", "endpoint": record.endpoint or "-",
                  "status": record.status, "ttft_ms": _ms(record.ttft_s or record.ttfb_s),
                  "duration_ms": _ms(record.e2e_s)}
        log.info("%s", self.line(fields))

    def line(self, fields: dict[str, object]) -> str:
        """``fields`` as one line: JSON, or ``name=value`` pairs (``-`` for none)."""
        if self._json:
            return json.dumps(fields, separators=(",", ":"))
        return " ".join(f"{k}={'-' if v is None else v}" for k, v in fields.items())


class NotProxied(logging.Filter):
    """Drops uvicorn's access line of a request to one of ``paths`` (ridge writes its own)."""

    def __init__(self, paths: Collection[str]) -> None:
        super().__init__()
        self._paths = frozenset(paths)

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (isinstance(args, tuple) and len(args) >= 3 and args[2] in self._paths)
