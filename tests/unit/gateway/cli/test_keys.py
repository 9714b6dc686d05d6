"""``ridge keys add|list|revoke`` on a keys file."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.access.keys import KeysFile, digest_of
from gateway.cli.main import main


def test_add_prints_the_key_once_and_stores_only_its_digest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "keys.json"
    assert main(["keys", "--file", str(path), "add", "team-a", "--models", "m1, m2",
                 "--rpm", "60", "--tpm", "10000", "--max-concurrent", "4"]) == 0
    key = capsys.readouterr().out.strip()
    assert key.startswith("rk-")
    text = path.read_text()
    assert key not in text and digest_of(key) in text
    (record,) = KeysFile(path).read()
    assert record.name == "team-a" and record.models == ("m1", "m2")
    assert (record.limits.rpm, record.limits.tpm, record.limits.max_concurrent) == \
        (60, 10000, 4)


def test_list_and_revoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tmp_path / "keys.json")
    assert main(["keys", "--file", path, "add", "a", "--admin"]) == 0
    assert main(["keys", "--file", path, "add", "b"]) == 0
    keys = capsys.readouterr().out.split()
    assert main(["keys", "--file", path, "list"]) == 0
    listing = capsys.readouterr().out
    assert "a " in listing and "b " in listing and "yes" in listing
    assert not any(key in listing for key in keys)
    assert main(["keys", "--file", path, "revoke", "a"]) == 0
    assert [r.name for r in KeysFile(path).read()] == ["b"]
    assert main(["keys", "--file", path, "revoke", "a"]) == 1


def test_a_name_twice_or_a_bad_limit_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tmp_path / "keys.json")
    assert main(["keys", "--file", path, "add", "a"]) == 0
    assert main(["keys", "--file", path, "add", "a"]) == 2
    assert main(["keys", "--file", path, "add", "c", "--rpm", "0"]) == 2
    assert "exists" in capsys.readouterr().err


def test_without_a_store_it_says_what_to_set(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("RIDGE_KEYS_FILE", raising=False)
    monkeypatch.delenv("RIDGE_REDIS_URL", raising=False)
    assert main(["keys", "list"]) == 2
    assert "RIDGE_KEYS_FILE" in capsys.readouterr().err
