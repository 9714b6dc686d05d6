"""The wrk driver: the Lua script, the RESULT line, and one short real run when wrk exists."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ridge_bench.harness.upstream import MODEL, start_servers
from ridge_bench.overhead import wrk

LINE = ('RESULT {"responses": 120, "duration_s": 2.0, "p50_ms": 0.5, "p99_ms": 3.25, '
        '"non200": 20, "connect": 1, "read": 2, "write": 0, "timeout": 3}')


def test_the_script_posts_the_body_and_counts_non_200() -> None:
    text = wrk.script(b'{"model": "m"}')
    assert '[==[{"model": "m"}]==]' in text and 'wrk.method = "POST"' in text
    assert "status ~= 200" in text
    with pytest.raises(ValueError):
        wrk.script(b'"]==]"')


def test_the_result_line() -> None:
    result = wrk.parse("Running 2s test\n" + LINE + "\n")
    assert (result.responses, result.ok, result.errors) == (120, 100, 26)
    assert result.rps == 50.0 and result.p99_ms == 3.25
    with pytest.raises(ValueError, match="no RESULT line"):
        wrk.parse("Running 2s test\n")


@pytest.fixture
async def url() -> AsyncIterator[str]:
    servers = await start_servers([0], 3)
    yield f"http://127.0.0.1:{servers[0].sockets[0].getsockname()[1]}"
    for server in servers:
        server.close()


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")
async def test_a_short_real_run(url: str, tmp_path: Path) -> None:
    script = tmp_path / "post.lua"
    script.write_text(wrk.script(json.dumps({"model": MODEL}).encode()))
    good = await wrk.run(url + "/v1/chat/completions", script, 4, 1)
    assert good.ok > 0 and good.errors == 0
    bad = await wrk.run(url + "/nowhere", script, 2, 1)
    assert bad.responses > 0 and bad.non200 == bad.responses
