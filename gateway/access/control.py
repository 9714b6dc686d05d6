"""Who may send a generation request, and how much: the key, its models, its limits.

:class:`Access` is what the :class:`~gateway.request.proxy.Proxy` asks, in this order:

1. :meth:`Access.authenticate` — before the body is read: the caller's key
   (:class:`~gateway.access.keys.KeyRing`; 401 when one is required and missing or unknown);
2. :meth:`Access.admit` — once the body is parsed: the model must be one the key may use
   (else OpenAI's 404 ``model_not_found``: a model the key cannot see does not exist for it),
   and the key's rate limits must have room (:mod:`gateway.access.limits`; else 429). The token
   charge at admission is the prompt estimate (⌈``len(body)`` ÷ ``chars_per_token``⌉,
   :func:`routing.tokens.counters.estimate_tokens`) plus
   ``max_tokens``, or the default output length when the request sets none;
3. :meth:`Access.settle` — when the request ends, however it ends: the lease is given back and
   the charge corrected by the engine's usage (prompt + completion tokens; a request that never
   reached an engine used none).

A request's deadline (end to end, [s]): its key's ``timeout_s``, else ``request_timeout_s``
(None: none). Without keys (authentication off) every request is anonymous and unlimited.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from gateway.access.keys import ANONYMOUS, Caller, KeyRing, model_refused
from gateway.access.limits import Grant, RateLimiter
from gateway.request.body import ParsedRequest
from routing.tokens.counters import CHARS_PER_TOKEN, estimate_tokens


@dataclass(frozen=True, slots=True)
class Estimate:
    """How a request's tokens are estimated at admission: prompt characters per token, and
    the output length assumed when ``max_tokens`` is not set [tokens]."""

    chars_per_token: float = CHARS_PER_TOKEN
    default_output_tokens: int = 256


class Access:
    """Keys, model permissions, rate limits and deadlines of one gateway (module docstring)."""

    def __init__(self, keys: KeyRing, limiter: RateLimiter, estimate: Estimate = Estimate(),
                 request_timeout_s: float | None = None) -> None:
        self.keys, self._limiter, self._estimate = keys, limiter, estimate
        self._timeout_s = request_timeout_s

    def authenticate(self, authorization: bytes | None) -> Caller:
        """The caller (ANONYMOUS when no key is required); 401 otherwise when the key is
        missing or unknown."""
        keys = self.keys
        return keys.authenticate(authorization) if keys.required else ANONYMOUS

    async def admit(self, caller: Caller, parsed: ParsedRequest) -> Grant | None:
        """Check the caller may use the model, and take the request from its limits (None:
        nothing to give back later)."""
        record = caller.record
        if record is None:
            return None
        if not record.allows(parsed.model):
            raise model_refused(parsed.model)
        if not record.limits.limited:
            return None
        return await self._limiter.admit(record, self.charge(parsed))

    def charge(self, parsed: ParsedRequest) -> int:
        """The tokens a request is charged at admission (module docstring)."""
        output = parsed.max_tokens if parsed.max_tokens is not None else \
            self._estimate.default_output_tokens
        return estimate_tokens(len(parsed.body), self._estimate.chars_per_token) + output

    async def settle(self, grant: Grant, used_tokens: int | None) -> None:
        """Settle ``grant`` (:meth:`RateLimiter.settle`), to its end even if the calling task
        is cancelled meanwhile: a shared grant in a task of its own (:func:`asyncio.shield`);
        one taken in this process settles without suspending, so nothing can interrupt it."""
        work = self._limiter.settle(grant, used_tokens)
        await (asyncio.shield(work) if grant.shared else work)

    def deadline_s(self, caller: Caller) -> float | None:
        """The request's end-to-end deadline [s], or None."""
        if caller.record is not None and caller.record.limits.timeout_s is not None:
            return caller.record.limits.timeout_s
        return self._timeout_s
