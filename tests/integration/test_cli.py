"""The ``ridge`` command as an operator meets it in the first hour, run as a subprocess: two
``ridge demo`` at once on one machine both serve (the second moves to free ports and says so);
a port in use, a bad setting or a fleet file that does not parse ends the command with exit
status 2 and one line saying what to change, never a traceback.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest

from tests.real_engine.servers import ROOT, Server, ridge_binary, spawn, stop_all, wait_ready

DEMO_FLEET = ROOT / "gateway" / "demo" / "demo-fleet.yaml"
MODEL = "smollm2-135m"
READY_TIMEOUT_S = 90.0  # a demo is ready in ~3 s on an idle 2-core machine
RUN_TIMEOUT_S = 60.0  # a command that fails at start-up ends in ~1 s
BANNER = re.compile(r"pools behind (http://127\.0\.0\.1:\d+)")

pytestmark = pytest.mark.timeout(300)


def _env(**extra: str) -> dict[str, str]:
    """This environment without any RIDGE_ setting, plus ``extra``; no drain on SIGTERM."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("RIDGE_")}
    return {**env, "RIDGE_DRAIN_S": "0", **extra}


def _ridge(argv: Sequence[str], **env: str) -> subprocess.CompletedProcess[str]:
    binary = ridge_binary()
    assert binary.exists(), f"{binary} does not exist: install the project (pip install -e .)"
    return subprocess.run([str(binary), *argv], cwd=ROOT, env=_env(**env), text=True,
                          capture_output=True, stdin=subprocess.DEVNULL,
                          timeout=RUN_TIMEOUT_S, check=False)


def _one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The only line on stderr of a command that failed with status 2."""
    assert done.returncode == 2, f"status {done.returncode}:\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port on 127.0.0.1 that something listens on, for the length of the test."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def _gateway_url(server: Server, timeout_s: float) -> str:
    """The gateway URL a demo prints in its banner (waited for; bounded)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = BANNER.search(server.log_path.read_text(errors="replace"))
        if found:
            return found.group(1)
        assert server.alive(), f"{server.name} exited:\n{server.log_tail()}"
        time.sleep(0.3)
    raise AssertionError(f"{server.name}: no banner in {timeout_s:.0f} s:\n{server.log_tail()}")


def _chat(url: str) -> str:
    resp = httpx.post(f"{url}/v1/chat/completions", timeout=30.0, json={
        "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Hello"}]})
    assert resp.status_code == 200, resp.text
    content: str = resp.json()["choices"][0]["message"]["content"]
    return content


def test_two_demos_at_once_both_serve(tmp_path: Path) -> None:
    argv = [str(ridge_binary()), "demo", "--host", "127.0.0.1"]  # default ports: both want them
    demos = [spawn(f"demo-{i}", argv, _env(), tmp_path, url="") for i in range(2)]
    try:
        for demo in demos:
            demo.url = _gateway_url(demo, READY_TIMEOUT_S)
        assert demos[0].url != demos[1].url
        wait_ready(demos, "/ready", READY_TIMEOUT_S)
        for demo in demos:
            assert _chat(demo.url)
        logs = [demo.log_path.read_text(errors="replace") for demo in demos]
        # at most one of them got the default gateway port and engine ports; the other said
        assert any("is in use; the gateway listens on port" in log for log in logs)
        assert any("simulated engines listen on free ports instead" in log for log in logs)
    finally:
        stop_all(demos)


@pytest.mark.parametrize("command", [["serve", "--config", str(DEMO_FLEET)], ["demo"]],
                         ids=["serve", "demo"])
def test_a_port_in_use_is_one_line_naming_it(command: list[str], taken_port: int) -> None:
    done = _ridge([*command, "--host", "127.0.0.1", "--port", str(taken_port)])
    assert _one_line_error(done) == (
        f"ridge: cannot listen on 127.0.0.1:{taken_port}: the port is already in use; "
        "pass --port with a free port (or set RIDGE_PORT)")
    assert "pools behind" not in done.stdout  # the demo announced nothing


@pytest.mark.parametrize(("argv", "env", "expected"), [
    (["--port", "99999"], {}, "ridge: --port 99999: must be less than or equal to 65535"),
    ([], {"RIDGE_PORT": "abc"},
     "ridge: RIDGE_PORT=abc: must be a valid integer, unable to parse string as an integer"),
    ([], {"RIDGE_UPSTREAM__TRANSPORT": "h3"},
     "ridge: RIDGE_UPSTREAM__TRANSPORT=h3: must be 'http1' or 'aiohttp'"),
])  # fmt: skip
def test_a_bad_setting_is_one_line(argv: list[str], env: dict[str, str],
                                   expected: str) -> None:
    done = _ridge(["serve", "--config", str(DEMO_FLEET), *argv], **env)
    assert _one_line_error(done) == expected


def test_a_fleet_file_that_does_not_parse_is_one_line(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("pools: [\n  a: b\n")
    line = _one_line_error(_ridge(["serve", "--config", str(fleet)]))
    assert line.startswith(f"ridge: {fleet}: not valid YAML at line 3, column 1: ")


def test_version() -> None:
    done = _ridge(["--version"])
    assert done.returncode == 0 and re.fullmatch(r"ridge \d+\.\d+\S*\n", done.stdout)
