"""The registry's operator log: the one logger every module of the registry writes to, and URLs
written without their credentials.

One line per transition, never one per poll: an endpoint's first health verdict and every
change after it (WARNING ``endpoint URL (pool P) is down: REASON``; INFO ``... is up`` or
``... is back up after N s down``); its pool losing its last healthy endpoint (WARNING; at
start-up: having none) and getting one back (INFO); the circuit breaker opening (WARNING) and
closing (INFO); a lever mismatch once per (endpoint, lever) while it lasts (WARNING) and its
end (INFO); an endpoint joining, leaving or gone (INFO). Every URL and reason goes through
:func:`redacted` first. The logger keeps the name operators configure (:data:`LOGGER`),
whichever module writes the line. The table of lines is in docs/telemetry.md; the registry in
docs/architecture.md.
"""

from __future__ import annotations

import re

LOGGER = "backends.registry.endpoints"
"""The name of the registry's logger (docs/telemetry.md)."""

_USERINFO = re.compile(r"(?<=://)[^/@\s]*@")


def redacted(text: str) -> str:
    """``text`` without the credentials (``user:password@``) of any URL in it."""
    return _USERINFO.sub("", text)
