"""API keys: records, the keys file, the key ring's refresh and the 401s."""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path
from typing import Any

import pytest

from gateway.access.keys import (
    KEY_PREFIX,
    KeyIndex,
    KeyLimits,
    KeyRecord,
    KeyRing,
    KeysFile,
    RedisKeys,
    bearer_token,
    digest_of,
    make_record,
    new_key,
)
from gateway.server.errors import GatewayError


def test_a_new_key_has_the_prefix_and_256_random_bits() -> None:
    keys = {new_key() for _ in range(50)}
    assert len(keys) == 50
    for key in keys:
        assert key.startswith(KEY_PREFIX) and len(key) == 3 + 43


def test_a_record_keeps_the_digest_and_a_hint_never_the_key() -> None:
    key = new_key()
    record = make_record(key, "team-a", models=["m"], limits=KeyLimits(rpm=10))
    assert record.digest == hashlib.sha256(key.encode()).hexdigest() == digest_of(key)
    assert record.hint == key[:7] + "…"
    assert key not in json.dumps(record.to_json())
    assert KeyRecord.from_json(record.to_json()) == record


@pytest.mark.parametrize("name", ["", " padded", "x" * 65, "tab\there"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError):
        make_record(new_key(), name)


def test_models_limit_what_a_key_may_use() -> None:
    assert make_record(new_key(), "all").allows("anything")
    only = make_record(new_key(), "one", models=["a"])
    assert only.allows("a") and not only.allows("b")


def test_the_index_finds_a_key_by_its_digest() -> None:
    key = new_key()
    index = KeyIndex([make_record(key, "k")])
    found = index.lookup(key.encode())
    assert found is not None and found.name == "k"
    assert index.lookup(b"rk-wrong") is None


def test_the_keys_file_is_written_whole_with_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    keys_file = KeysFile(path)
    assert keys_file.read() == []
    records = [make_record(new_key(), "a"), make_record(new_key(), "b")]
    keys_file.write(records)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert keys_file.read() == records
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


def test_a_file_that_is_not_a_keys_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text('{"keys": [{"name": "x"}]}')
    with pytest.raises(ValueError, match="not a ridge keys file"):
        KeysFile(path).read()
    path.write_bytes(b'{"keys": [{"name": "caf\xe9"}]}')
    with pytest.raises(ValueError, match="not a ridge keys file"):
        KeysFile(path).read()


async def test_the_ring_reloads_a_changed_file_and_keeps_the_last_good_keys(
        tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    keys_file = KeysFile(path)
    ring = KeyRing([keys_file])
    await ring.refresh()
    assert not ring.required  # auto, no key yet: open
    key = new_key()
    keys_file.write([make_record(key, "a")])
    await ring.refresh()
    assert ring.required and ring.authenticate(b"Bearer " + key.encode()).name == "a"
    path.write_text("not json at all, and longer than before")
    await ring.refresh()
    assert ring.authenticate(b"Bearer " + key.encode()).name == "a"
    keys_file.write([])
    await ring.refresh()
    assert not ring.required


class FakeHash:
    def __init__(self, raw: dict[str, str] | None = None, fail: bool = False) -> None:
        self.raw, self.fail = raw or {}, fail

    async def hgetall(self, name: str) -> Any:
        if self.fail:
            raise ConnectionError("down")
        return self.raw


async def test_redis_keys_are_read_and_a_failure_keeps_the_last_ones() -> None:
    key = new_key()
    record = make_record(key, "shared")
    source = FakeHash({record.digest: json.dumps(record.to_json()), "bad": "{"})
    ring = KeyRing([RedisKeys(source, "ridge:")])
    await ring.refresh()
    assert ring.authenticate(b"Bearer " + key.encode()).name == "shared"
    source.fail = True
    await ring.refresh()
    assert ring.authenticate(b"Bearer " + key.encode()).name == "shared"


async def test_the_file_wins_over_redis_for_the_same_key(tmp_path: Path) -> None:
    key = new_key()
    in_file = make_record(key, "file", limits=KeyLimits(rpm=1))
    in_redis = make_record(key, "redis")
    keys_file = KeysFile(tmp_path / "keys.json")
    keys_file.write([in_file])
    ring = KeyRing([keys_file, RedisKeys(FakeHash({key: json.dumps(in_redis.to_json())}), "p:")])
    await ring.refresh()
    assert ring.authenticate(b"Bearer " + key.encode()).name == "file"


def _refused(ring: KeyRing, header: bytes | None) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        ring.authenticate(header)
    return caught.value


async def test_missing_and_wrong_keys_get_openai_401s_without_the_key() -> None:
    ring = KeyRing((), mode="on")
    await ring.refresh()
    missing = _refused(ring, None)
    wrong = _refused(ring, b"Bearer rk-guess")
    for exc in (missing, wrong):
        assert exc.status == 401 and exc.code == "invalid_api_key"
        assert exc.body()["error"]["type"] == "invalid_request_error"
        assert (b"www-authenticate", b"Bearer") in exc.headers
    assert "rk-guess" not in json.dumps(wrong.body())
    assert "Authorization" in missing.message


async def test_off_never_asks_even_with_keys(tmp_path: Path) -> None:
    keys_file = KeysFile(tmp_path / "k.json")
    keys_file.write([make_record(new_key(), "a")])
    ring = KeyRing([keys_file], mode="off")
    await ring.refresh()
    assert not ring.required and ring.authenticate(None).record is None


@pytest.mark.parametrize(("header", "token"), [
    (b"Bearer abc", b"abc"), (b"bearer   abc ", b"abc"), (b"Basic abc", None),
    (b"Bearer", None), (b"Bearer ", None), (None, None)])
def test_bearer_tokens(header: bytes | None, token: bytes | None) -> None:
    assert bearer_token(header) == token
