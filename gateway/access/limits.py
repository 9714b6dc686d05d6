"""Rate limits and quotas per API key: requests and tokens per minute, concurrent requests.

Per key, two token buckets (``rpm``, ``tpm``: capacity per minute, refilled per second) and a
lease set (``max_concurrent``, leases expiring after ``lease_ttl_s``), checked and taken
together, all or none. A request takes its token estimate at admission and is corrected by the
engine's usage when it ends (:meth:`RateLimiter.settle`; the bucket may go into debt down to
``-tpm``). Over a limit: 429 ``rate_limit_exceeded`` with ``Retry-After`` [s] and
``x-ratelimit-*`` headers.

:class:`LocalLimiter` keeps the buckets in this process (with N workers and no Redis, each
enforces 1/N of a limit); :class:`RedisLimiter` shares them through one Lua script
(:data:`LIMITS_SCRIPT`, the arithmetic of :func:`take`, on Redis's clock), with the local
buckets standing in while Redis is down. See docs/gateway.md#rate-limits.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.access.keys import KeyLimits, KeyRecord
from gateway.server.errors import GatewayError

MINUTE_S = 60.0


@dataclass(frozen=True, slots=True)
class Bucket:
    """One token bucket's level [units] at time ``at`` [s]."""

    level: float
    at: float


def refill(bucket: Bucket | None, capacity: float, now: float) -> float:
    """The level of a bucket of ``capacity`` per minute at ``now`` (a new bucket is full)."""
    if bucket is None:
        return capacity
    return min(capacity, bucket.level + max(0.0, now - bucket.at) * capacity / MINUTE_S)


def seconds_until(level: float, wanted: float, capacity: float) -> float:
    """Time [s] until a bucket at ``level`` holds ``wanted`` (0 if it does)."""
    return max(0.0, (wanted - level) * MINUTE_S / capacity) if capacity > 0 else math.inf


@dataclass(frozen=True, slots=True)
class LimitDecision:
    """What the limits said: ``refused`` None = admitted, else ``requests``, ``tokens`` or
    ``concurrent``; the bucket levels after the request [units], and the wait [s] before a
    retry could pass."""

    refused: str | None
    requests_left: float | None
    tokens_left: float | None
    retry_after_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Grant:
    """An admitted request's charge: tokens taken, its lease, where it was taken."""

    record: KeyRecord
    tokens: int
    lease: str | None
    shared: bool
    headers: tuple[tuple[bytes, bytes], ...]


class RateLimiter(Protocol):
    async def admit(self, record: KeyRecord, tokens: int) -> Grant:
        """Take a request of ``tokens`` from ``record``'s limits, or raise the 429."""
        ...

    async def settle(self, grant: Grant, used_tokens: int | None) -> None:
        """The request ended: give back its lease, correct its tokens by ``used_tokens``. A
        grant that is not ``shared`` (taken in this process) settles without suspending."""
        ...


class LocalLimiter:
    """The limits of one process (see the module); ``share``: this process's part of every
    limit (1/N with N workers)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, share: float = 1.0) -> None:
        self._clock, self._share = clock, share
        self._requests: dict[str, Bucket] = {}
        self._tokens: dict[str, Bucket] = {}
        self._leases: dict[str, int] = {}

    def scaled(self, limits: KeyLimits) -> KeyLimits:
        """``limits`` as this process enforces them."""
        if self._share == 1.0:
            return limits

        def part(n: int | None) -> int | None:
            return None if n is None else max(1, math.ceil(n * self._share))
        return KeyLimits(part(limits.rpm), part(limits.tpm), part(limits.max_concurrent),
                         limits.timeout_s)

    async def admit(self, record: KeyRecord, tokens: int) -> Grant:
        return self.admit_now(record, tokens)

    def admit_now(self, record: KeyRecord, tokens: int) -> Grant:
        limits, name, now = self.scaled(record.limits), record.name, self._clock()
        decision = take(limits, tokens, now, self._requests.get(name), self._tokens.get(name),
                       self._leases.get(name, 0))
        if decision.refused is not None:
            raise refusal(record, limits, tokens, decision)
        if limits.rpm is not None:
            self._requests[name] = Bucket(decision.requests_left or 0.0, now)
        if limits.tpm is not None:
            self._tokens[name] = Bucket(decision.tokens_left or 0.0, now)
        if limits.max_concurrent is not None:
            self._leases[name] = self._leases.get(name, 0) + 1
        return Grant(record, tokens, name if limits.max_concurrent is not None else None,
                     False, limit_headers(limits, decision))

    async def settle(self, grant: Grant, used_tokens: int | None) -> None:
        self.settle_now(grant, used_tokens)

    def settle_now(self, grant: Grant, used_tokens: int | None) -> None:
        name, limits = grant.record.name, self.scaled(grant.record.limits)
        if grant.lease is not None and self._leases.get(name, 0) > 0:
            self._leases[name] -= 1
        if limits.tpm is None or used_tokens is None or used_tokens == grant.tokens:
            return
        now = self._clock()
        level = refill(self._tokens.get(name), limits.tpm, now)
        self._tokens[name] = Bucket(corrected(level, grant.tokens, used_tokens, limits.tpm), now)


def take(limits: KeyLimits, tokens: int, now: float, requests: Bucket | None,
         token_bucket: Bucket | None, leases: int) -> LimitDecision:
    """Whether a request of ``tokens`` passes ``limits`` (module docstring); the levels after."""
    req = refill(requests, limits.rpm, now) if limits.rpm is not None else None
    tok = refill(token_bucket, limits.tpm, now) if limits.tpm is not None else None
    if limits.max_concurrent is not None and leases >= limits.max_concurrent:
        return LimitDecision("concurrent", req, tok, 1.0)
    if req is not None and limits.rpm is not None and req < 1.0:
        return LimitDecision("requests", req, tok, seconds_until(req, 1.0, limits.rpm))
    if tok is not None and limits.tpm is not None and tok < tokens:
        wait = seconds_until(tok, tokens, limits.tpm) if tokens <= limits.tpm else math.inf
        return LimitDecision("tokens", req, tok, wait)
    return LimitDecision(None, None if req is None else req - 1.0,
                   None if tok is None else tok - tokens)


def corrected(level: float, charged: int, used: int, capacity: float) -> float:
    """A token bucket's level once a request charged ``charged`` turned out to use ``used``:
    the difference given back or taken, within [-capacity, capacity]."""
    return max(-capacity, min(capacity, level + charged - used))


def refusal(record: KeyRecord, limits: KeyLimits, tokens: int,
            decision: LimitDecision) -> GatewayError:
    """The 429 for a refused request (module docstring)."""
    headers = limit_headers(limits, decision)
    if math.isinf(decision.retry_after_s):
        return GatewayError(
            429, f"Request too large for key '{record.name}': about {tokens} tokens requested, "
            f"the limit is {limits.tpm} tokens per minute.", code="request_too_large",
            kind="tokens", headers=headers)
    what = {"requests": f"requests per minute (RPM): limit {limits.rpm}",
            "tokens": f"tokens per minute (TPM): limit {limits.tpm}, requested {tokens}",
            "concurrent": f"concurrent requests: limit {limits.max_concurrent}"}
    retry = max(1, math.ceil(decision.retry_after_s))
    kind = "tokens" if decision.refused == "tokens" else "requests"
    return GatewayError(
        429, f"Rate limit reached for key '{record.name}' on {what[decision.refused or '']}. "
        f"Please try again in {duration(decision.retry_after_s)}.", code="rate_limit_exceeded",
        kind=kind, headers=((b"retry-after", str(retry).encode()), *headers))


def limit_headers(limits: KeyLimits, decision: LimitDecision) -> tuple[tuple[bytes, bytes], ...]:
    """The ``x-ratelimit-*`` headers of the key's bucket levels (module docstring)."""
    out: list[tuple[bytes, bytes]] = []
    for kind, capacity, left in (("requests", limits.rpm, decision.requests_left),
                                 ("tokens", limits.tpm, decision.tokens_left)):
        if capacity is None or left is None:
            continue
        reset = seconds_until(left, capacity, capacity)
        out += [(f"x-ratelimit-limit-{kind}".encode(), str(capacity).encode()),
                (f"x-ratelimit-remaining-{kind}".encode(), str(max(0, int(left))).encode()),
                (f"x-ratelimit-reset-{kind}".encode(), duration(reset).encode())]
    return tuple(out)


def duration(seconds: float) -> str:
    """OpenAI's form of a reset time: ``20ms``, ``1s``, ``1.5s``, ``6m0s``, ``1h2m3s``."""
    if seconds < 1.0:
        return f"{max(0, round(seconds * 1000))}ms"
    if seconds < MINUTE_S:
        return f"{seconds:.3g}s"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes}m{secs}s" if hours else f"{minutes}m{secs}s"


LIMITS_SCRIPT = """
-- KEYS[1]: the key's buckets (hash r, rt, t, tt); KEYS[2]: its leases (zset lease -> expiry ms)
-- ARGV: op ('admit' | 'settle'), rpm, tpm, max_concurrent (-1 = none), tokens, lease,
--       lease ttl ms, used tokens (settle; -1 = unknown)
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local rpm, tpm, maxc = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local tokens = tonumber(ARGV[5])
local h = redis.call('HMGET', KEYS[1], 'r', 'rt', 't', 'tt')
local function refill(level, at, cap)
  if level == false then return cap end
  return math.min(cap, tonumber(level) + math.max(0, now - tonumber(at)) * cap / 60)
end
local req, tok = -1, -1
if rpm >= 0 then req = refill(h[1], h[2], rpm) end
if tpm >= 0 then tok = refill(h[3], h[4], tpm) end
if ARGV[1] == 'settle' then
  redis.call('ZREM', KEYS[2], ARGV[6])
  local used = tonumber(ARGV[8])
  if tpm >= 0 and used >= 0 then
    tok = math.max(-tpm, math.min(tpm, tok + tokens - used))
    redis.call('HSET', KEYS[1], 't', tostring(tok), 'tt', tostring(now))
  end
  return {1, '', '0', tostring(req), tostring(tok)}
end
if maxc >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now * 1000)
  if redis.call('ZCARD', KEYS[2]) >= maxc then
    return {0, 'concurrent', '1', tostring(req), tostring(tok)}
  end
end
if rpm >= 0 and req < 1 then
  return {0, 'requests', tostring((1 - req) * 60 / rpm), tostring(req), tostring(tok)}
end
if tpm >= 0 and tok < tokens then
  local wait = 'inf'
  if tokens <= tpm then wait = tostring((tokens - tok) * 60 / tpm) end
  return {0, 'tokens', wait, tostring(req), tostring(tok)}
end
if rpm >= 0 then
  req = req - 1
  redis.call('HSET', KEYS[1], 'r', tostring(req), 'rt', tostring(now))
end
if tpm >= 0 then
  tok = tok - tokens
  redis.call('HSET', KEYS[1], 't', tostring(tok), 'tt', tostring(now))
end
redis.call('EXPIRE', KEYS[1], 120)
if maxc >= 0 then
  local ttl = tonumber(ARGV[7])
  redis.call('ZADD', KEYS[2], now * 1000 + ttl, ARGV[6])
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return {1, '', '0', tostring(req), tostring(tok)}
"""


class SharedBackend(Protocol):
    """What :class:`RedisLimiter` needs of the shared router state: whether Redis is up, and
    its client."""

    @property
    def up(self) -> bool: ...

    @property
    def client(self) -> Any: ...


class RedisLimiter:
    """The limits in Redis, shared by every gateway replica; a :class:`LocalLimiter` while
    Redis is down or a call fails (module docstring)."""

    def __init__(self, backend: SharedBackend, prefix: str, lease_ttl_s: float,
                 local: LocalLimiter | None = None) -> None:
        self._backend, self._prefix = backend, prefix
        self._ttl_ms = str(int(lease_ttl_s * 1000))
        self._local = local or LocalLimiter()
        self._script = backend.client.register_script(LIMITS_SCRIPT)

    def _keys(self, record: KeyRecord) -> list[str]:
        base = f"{self._prefix}rl:{record.digest[:16]}"
        return [base, base + ":leases"]

    async def admit(self, record: KeyRecord, tokens: int) -> Grant:
        if not self._backend.up:
            return self._local.admit_now(record, tokens)
        lease = uuid.uuid4().hex if record.limits.max_concurrent is not None else ""
        try:
            raw = await self._script(keys=self._keys(record),
                                     args=["admit", *_limit_args(record.limits), tokens, lease,
                                           self._ttl_ms, -1])
        except Exception:  # noqa: BLE001 - any Redis failure: the local limits stand in
            return self._local.admit_now(record, tokens)
        decision = _decision(raw, record.limits)
        if decision.refused is not None:
            raise refusal(record, record.limits, tokens, decision)
        return Grant(record, tokens, lease or None, True,
                     limit_headers(record.limits, decision))

    async def settle(self, grant: Grant, used_tokens: int | None) -> None:
        if not grant.shared:
            self._local.settle_now(grant, used_tokens)
            return
        try:
            await self._script(keys=self._keys(grant.record),
                               args=["settle", *_limit_args(grant.record.limits), grant.tokens,
                                     grant.lease or "", self._ttl_ms,
                                     -1 if used_tokens is None else used_tokens])
        except Exception:  # noqa: BLE001 - the lease expires by itself; tokens stay charged
            return


def _limit_args(limits: KeyLimits) -> list[int]:
    return [-1 if n is None else n for n in (limits.rpm, limits.tpm, limits.max_concurrent)]


def _decision(raw: Any, limits: KeyLimits) -> LimitDecision:
    """The script's answer: ok, refused limit, wait [s], bucket levels (of set limits)."""
    ok, which, wait, req, tok = raw
    return LimitDecision(None if int(ok) == 1 else str(which),
                   None if limits.rpm is None else float(req),
                   None if limits.tpm is None else float(tok), float(wait))
