"""API keys: who may call the gateway, for which models, under which limits.

A key is ``rk-`` and 43 URL-safe characters (256 random bits); ridge stores only its SHA-256
digest, with a :class:`KeyRecord` (name, models, :class:`KeyLimits`, admin, created, prefix).
Records live in a keys file (:class:`KeysFile`, ``RIDGE_KEYS_FILE``, written atomically, mode
0600, by ``ridge keys``) and, with a shared router state, in Redis (:class:`RedisKeys`); the
file's record wins a tie. :class:`KeyRing` reloads both into a :class:`KeyIndex` every
``refresh_s`` in the background, so no request waits on either.

Authentication (:meth:`KeyRing.authenticate`): ``auth`` on, or ``auto`` with a key known;
``Authorization: Bearer KEY``; a missing or unknown key is OpenAI's 401 ``invalid_api_key``.
Keys never reach logs, metric labels or error bodies. See docs/gateway.md#api-keys.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import secrets
import tempfile
import time
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, Protocol

from gateway.server.errors import GatewayError

log = logging.getLogger("ridge")

KEY_PREFIX = "rk-"
HINT_CHARS = 7
"""Characters of a key kept in its record to recognise it by (the prefix and 4 more)."""
MAX_NAME = 64
AuthMode = Literal["auto", "on", "off"]
_CHALLENGE = ((b"www-authenticate", b"Bearer"),)


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """A key's limits; None = unlimited. ``rpm`` [requests/minute], ``tpm`` [tokens/minute:
    prompt + completion], ``max_concurrent`` [requests in flight], ``timeout_s`` [s, the
    deadline of each of its requests, end to end]."""

    rpm: int | None = None
    tpm: int | None = None
    max_concurrent: int | None = None
    timeout_s: float | None = None

    @property
    def limited(self) -> bool:
        """Whether any rate or concurrency limit is set (the deadline is not one)."""
        return self.rpm is not None or self.tpm is not None or self.max_concurrent is not None


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """What ridge keeps of one key (never the key itself)."""

    name: str
    digest: str
    hint: str
    models: tuple[str, ...] = ()
    limits: KeyLimits = field(default_factory=KeyLimits)
    admin: bool = False
    created: float = 0.0

    def allows(self, model: str) -> bool:
        """Whether the key may use ``model`` (no models listed: every model)."""
        return not self.models or model in self.models

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "models": list(self.models)}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> KeyRecord:
        """A record from its JSON form; raises ValueError/TypeError/KeyError on a bad one."""
        limits = KeyLimits(**dict(raw.get("limits") or {}))
        record = cls(str(raw["name"]), str(raw["digest"]), str(raw.get("hint", "")),
                     tuple(str(m) for m in raw.get("models") or ()), limits,
                     bool(raw.get("admin", False)), float(raw.get("created", 0.0)))
        if len(record.digest) != 64:
            raise ValueError(f"key {record.name!r}: not a SHA-256 digest")
        return record


def new_key() -> str:
    """A fresh key: ``rk-`` + 256 random bits, URL-safe base64."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def digest_of(key: str | bytes) -> str:
    """The SHA-256 hex digest ridge stores for ``key``."""
    raw = key.encode() if isinstance(key, str) else key
    return hashlib.sha256(raw).hexdigest()


def make_record(key: str, name: str, *, models: Iterable[str] = (),
                limits: KeyLimits = KeyLimits(), admin: bool = False) -> KeyRecord:
    """The record of a new ``key`` (validated name: 1–64 visible characters)."""
    if not 0 < len(name) <= MAX_NAME or not name.isprintable() or name != name.strip():
        raise ValueError(f"a key name is 1-{MAX_NAME} printable characters, no outer spaces")
    return KeyRecord(name, digest_of(key), key[:HINT_CHARS] + "…", tuple(models), limits,
                     admin, time.time())


class KeyIndex:
    """The records ridge knows, by digest; immutable once built."""

    def __init__(self, records: Iterable[KeyRecord] = ()) -> None:
        self._by_digest: Mapping[str, KeyRecord] = MappingProxyType(
            {r.digest: r for r in records})

    def __len__(self) -> int:
        return len(self._by_digest)

    def lookup(self, key: bytes) -> KeyRecord | None:
        """The record of ``key``, or None."""
        return self._by_digest.get(hashlib.sha256(key).hexdigest())

    def records(self) -> tuple[KeyRecord, ...]:
        return tuple(self._by_digest.values())


class KeySource(Protocol):
    """Where records are loaded from."""

    async def load(self) -> list[KeyRecord] | None:
        """The records, or None when they cannot be read now (the last ones are kept)."""
        ...


class KeysFile:
    """The keys file (JSON, mode 0600); read and written whole, written atomically."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._seen: tuple[float, int] | None = None
        self._records: list[KeyRecord] = []

    def read(self) -> list[KeyRecord]:
        """Every record; no file: none. Raises ValueError on a file that is not a keys file."""
        try:
            text = self.path.read_bytes()
        except FileNotFoundError:
            return []
        try:
            raw = json.loads(text.decode("utf-8"))
            return [KeyRecord.from_json(r) for r in raw["keys"]]
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"{self.path}: not a ridge keys file ({exc})") from exc

    def write(self, records: Iterable[KeyRecord]) -> None:
        """Replace the file's records (a temporary file renamed over it, mode 0600)."""
        text = json.dumps({"keys": [r.to_json() for r in records]}, indent=2)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".keys-")
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text + "\n")
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    async def load(self) -> list[KeyRecord] | None:
        """The records, read again only when the file changed (size or modification time)."""
        try:
            stat = self.path.stat()
            seen: tuple[float, int] | None = (stat.st_mtime, stat.st_size)
        except FileNotFoundError:
            seen = None
        if seen == self._seen and (seen is not None or not self._records):
            return self._records
        try:
            self._records = self.read()
        except (ValueError, OSError) as exc:
            log.error("keys file unreadable, keeping the keys loaded before: %s", exc)
            return None
        self._seen = seen
        return self._records


class HashClient(Protocol):
    """What :class:`RedisKeys` needs of an asyncio Redis client."""

    def hgetall(self, name: str) -> Awaitable[Any]: ...


class RedisKeys:
    """The records in the Redis hash ``{prefix}keys`` (digest → record JSON)."""

    def __init__(self, client: HashClient, prefix: str, timeout_s: float = 1.0) -> None:
        self._client, self.hash, self._timeout_s = client, prefix + "keys", timeout_s

    async def load(self) -> list[KeyRecord] | None:
        try:
            async with asyncio.timeout(self._timeout_s):
                raw = await self._client.hgetall(self.hash)
        except Exception as exc:  # noqa: BLE001 - any Redis failure: keep the last keys
            log.warning("keys not refreshed from Redis (%s); keeping the keys loaded before",
                        type(exc).__name__)
            return None
        return _parse_hash(raw)


def _parse_hash(raw: Mapping[Any, Any]) -> list[KeyRecord]:
    records = []
    for value in raw.values():
        try:
            records.append(KeyRecord.from_json(json.loads(value)))
        except (ValueError, TypeError, KeyError) as exc:
            log.error("an unreadable key record in Redis was skipped (%s)", exc)
    return records


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a request: the key's record, or None when authentication is off."""

    record: KeyRecord | None
    name: str | None = field(init=False)
    """The key's name (None when anonymous): a field, as every request reads it."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", self.record.name if self.record else None)


ANONYMOUS = Caller(None)


class KeyRing:
    """The gateway's keys: a :class:`KeyIndex` refreshed from its sources in the background."""

    def __init__(self, sources: Iterable[KeySource], mode: AuthMode = "auto",
                 refresh_s: float = 2.0) -> None:
        self._sources = tuple(sources)
        self._mode, self._refresh_s = mode, refresh_s
        self._loaded: list[list[KeyRecord]] = [[] for _ in self._sources]
        self.required = mode == "on"
        """Whether requests must carry a key (see the module): kept with :attr:`index`, as
        every request reads it."""
        self.index = KeyIndex()
        self._task: asyncio.Task[None] | None = None

    @property
    def index(self) -> KeyIndex:
        """The records known now."""
        return self._index

    @index.setter
    def index(self, index: KeyIndex) -> None:
        self._index = index
        self.required = self._mode == "on" or (self._mode == "auto" and len(index) > 0)

    async def refresh(self) -> None:
        """Load every source again (a source that fails keeps its last records)."""
        for i, source in enumerate(self._sources):
            records = await source.load()
            if records is not None:
                self._loaded[i] = records
        merged: dict[str, KeyRecord] = {}
        for records in reversed(self._loaded):  # the first source (the file) wins
            merged.update((r.digest, r) for r in records)
        if len(merged) != len(self.index):
            log.info("API keys: %d known", len(merged))
        self.index = KeyIndex(merged.values())

    async def start(self) -> None:
        """Load once, then keep refreshing until :meth:`stop`."""
        await self.refresh()
        if self._mode == "on" and not self.index:
            log.warning("authentication is on and no API key is configured: every request "
                        "will be refused (ridge keys add NAME)")
        if self._sources:
            self._task = asyncio.create_task(self._keep_refreshing())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _keep_refreshing(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            try:
                await self.refresh()
            except Exception:  # noqa: BLE001 - a refresh must never stop refreshing
                log.exception("refreshing the API keys failed")

    def authenticate(self, authorization: bytes | None) -> Caller:
        """The caller of a request with this ``Authorization`` header; 401 when a key is
        required and missing or unknown."""
        if not self.required:
            return ANONYMOUS
        token = bearer_token(authorization)
        if token is None:
            raise GatewayError(
                401, "You didn't provide an API key. Provide it in an Authorization header "
                "using Bearer auth (Authorization: Bearer YOUR_KEY).",
                code="invalid_api_key", headers=_CHALLENGE)
        record = self.index.lookup(token)
        if record is None:
            raise GatewayError(401, "Incorrect API key provided.", code="invalid_api_key",
                               headers=_CHALLENGE)
        return Caller(record)


def bearer_token(authorization: bytes | None) -> bytes | None:
    """The token of an ``Authorization: Bearer TOKEN`` header (scheme case-insensitive)."""
    if authorization is None:
        return None
    scheme, _, token = authorization.strip().partition(b" ")
    token = token.strip()
    return token if scheme.lower() == b"bearer" and token else None


def model_refused(model: str) -> GatewayError:
    """OpenAI's answer to a model the key may not use: the model does not exist for it."""
    return GatewayError(404, f"The model '{model}' does not exist or you do not have access "
                        "to it.", param="model", code="model_not_found")
