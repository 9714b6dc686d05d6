"""``ridge keys add|list|revoke``: manage API keys (:mod:`gateway.access.keys`).

The keys go to the keys file (``--file`` or ``RIDGE_KEYS_FILE``) and, when a Redis URL is set
(``--redis-url`` or ``RIDGE_REDIS_URL``), to Redis, where every gateway replica sharing that
Redis reads them. ``add`` prints the new key once: ridge keeps only its digest. Running
gateways pick changes up within ``RIDGE_KEYS_REFRESH_S``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from redis import Redis
from redis.exceptions import RedisError

from gateway.access.keys import KeyLimits, KeyRecord, KeysFile, make_record, new_key
from gateway.settings import Settings


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``keys`` subcommand and its own subcommands."""
    keys = sub.add_parser("keys", help="manage API keys (add, list, revoke)", description=(
        "Manage the API keys clients send as `Authorization: Bearer KEY`: in the keys file "
        "and, with a Redis URL, in Redis, where every gateway sharing it reads them. Running "
        "gateways pick changes up within RIDGE_KEYS_REFRESH_S. ridge keeps only digests."))
    keys.add_argument("--file", help="keys file (default RIDGE_KEYS_FILE)")
    keys.add_argument("--redis-url", help="also in this Redis (default RIDGE_REDIS_URL)")
    actions = keys.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", help="create a key; prints it once",
                             description="Create a key with its limits and print it, once: "
                             "only its digest is stored.")
    add.add_argument("name", help="the key's name (in logs and metrics; 1-64 characters)")
    add.add_argument("--models", default="", help="comma-separated models it may use "
                     "(default: every model)")
    add.add_argument("--rpm", type=int, help="requests per minute")
    add.add_argument("--tpm", type=int, help="tokens per minute (prompt + completion)")
    add.add_argument("--max-concurrent", type=int, help="requests in flight at once")
    add.add_argument("--timeout", type=float, help="deadline of each request [s]")
    add.add_argument("--admin", action="store_true", help="may read /metrics and /docs")
    actions.add_parser("list", help="the keys (names, first characters, limits)",
                       description="List the keys: names, first characters, limits.")
    revoke = actions.add_parser("revoke", help="delete a key by name",
                                description="Delete every key of that name; requests with it "
                                "are refused once the gateways reload the keys.")
    revoke.add_argument("name", help="the name given to `ridge keys add`")


@dataclass
class Stores:
    """Where the keys are: the keys file and/or Redis (hash ``{prefix}keys``)."""

    file: KeysFile | None
    redis: Redis | None
    hash: str

    def records(self) -> list[KeyRecord]:
        found = {r.digest: r for r in self._redis_records()}
        found.update((r.digest, r) for r in (self.file.read() if self.file else []))
        return sorted(found.values(), key=lambda r: (r.name, r.created))

    def _redis_records(self) -> list[KeyRecord]:
        if self.redis is None:
            return []
        raw = self.redis.hgetall(self.hash)
        return [KeyRecord.from_json(json.loads(v)) for v in raw.values()]

    def add(self, record: KeyRecord) -> None:
        if self.file is not None:
            self.file.write([*self.file.read(), record])
        if self.redis is not None:
            self.redis.hset(self.hash, record.digest, json.dumps(record.to_json()))

    def revoke(self, name: str) -> int:
        """Delete every key named ``name``; how many were deleted."""
        gone = 0
        if self.file is not None:
            records = self.file.read()
            kept = [r for r in records if r.name != name]
            gone += len(records) - len(kept)
            self.file.write(kept)
        if self.redis is not None:
            digests = [r.digest for r in self._redis_records() if r.name == name]
            if digests:
                gone += int(self.redis.hdel(self.hash, *digests))
        return gone


def run(args: argparse.Namespace, settings: Settings) -> int:
    """``ridge keys ...``; the exit status."""
    path = args.file or settings.keys_file
    url = args.redis_url or settings.redis_url
    if not path and not url:
        print("ridge keys: no keys file or Redis: pass --file FILE or set RIDGE_KEYS_FILE "
              "(and/or RIDGE_REDIS_URL)", file=sys.stderr)
        return 2
    stores = Stores(KeysFile(path) if path else None,
                    Redis.from_url(url, decode_responses=True) if url else None,
                    settings.state.redis_prefix + "keys")
    try:
        return _act(args, stores)
    except (ValueError, OSError, RedisError) as exc:
        print(f"ridge keys: {exc}", file=sys.stderr)
        return 2


def _act(args: argparse.Namespace, stores: Stores) -> int:
    if args.action == "add":
        return _add(args, stores)
    if args.action == "list":
        _print_list(stores.records())
        return 0
    if stores.revoke(args.name) == 0:
        print(f"ridge keys: no key named {args.name!r}", file=sys.stderr)
        return 1
    print(f"revoked {args.name!r}")
    return 0


def _add(args: argparse.Namespace, stores: Stores) -> int:
    if any(r.name == args.name for r in stores.records()):
        raise ValueError(f"a key named {args.name!r} exists (revoke it first)")
    for flag in ("rpm", "tpm", "max_concurrent", "timeout"):
        value = getattr(args, flag)
        if value is not None and value <= 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be positive")
    key = new_key()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    limits = KeyLimits(args.rpm, args.tpm, args.max_concurrent, args.timeout)
    stores.add(make_record(key, args.name, models=models, limits=limits, admin=args.admin))
    print(key)
    print(f"key {args.name!r} created; this is the only time it is shown", file=sys.stderr)
    return 0


def _print_list(records: Sequence[KeyRecord]) -> None:
    print(f"{'NAME':<24} {'KEY':<11} {'MODELS':<24} {'RPM':>6} {'TPM':>9} {'CONC':>5} "
          f"{'ADMIN':<5} CREATED")
    for r in records:
        lim = r.limits
        print(f"{r.name:<24} {r.hint:<11} {','.join(r.models) or '*':<24} "
              f"{_n(lim.rpm):>6} {_n(lim.tpm):>9} {_n(lim.max_concurrent):>5} "
              f"{'yes' if r.admin else 'no':<5} "
              f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(r.created))}")


def _n(value: int | None) -> str:
    return "-" if value is None else str(value)
