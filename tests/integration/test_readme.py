"""The README's commands work as written, against a running ``ridge demo``.

Which blocks run: every fenced code block of README.md whose info string is ``sh``, ``bash`` or
``python``, except
- the preamble's, before the first ``## `` section: ``make demo`` and ``make test``, the
  commands that build this checkout and run this very suite;
- a block right after (blank lines aside) an HTML comment ``<!-- not run in tests: WHY -->``,
  e.g. the deployment commands, which need Docker or a cluster.
A block with another info string (``yaml``, none) is never run.

How: one ``ridge demo`` is started as a subprocess on a free gateway port (its simulated engines
move to free ports by themselves when theirs are taken), waited for until ``/ready`` answers
(bounded), and stopped at the end whatever happens. The README's addresses and paths for the
reader's own machine are replaced by the test's (:data:`SUBSTITUTIONS`: the gateway's
``127.0.0.1:8080`` by the demo's port, the keys file by a temporary one). A shell block runs
under ``bash -e -u -o pipefail`` (every command must succeed) with ``.venv/bin`` first on
``PATH`` and a curl configuration that fails on an HTTP error status and bounds each transfer
(``--fail-with-body``, ``--max-time``); a Python block runs with this interpreter (the
project's ``.venv``, which has the ``openai`` package). Each must exit 0 within
:data:`BLOCK_TIMEOUT_S`, and print what the README says it prints (:data:`EXPECTED`: for
each block, found by a command it contains, patterns its output must match).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.real_engine.servers import ROOT, Server, free_port, ridge_binary, spawn, wait_ready

README = ROOT / "README.md"
RUNNABLE = frozenset({"sh", "bash", "python"})
SKIP_MARK = re.compile(r"<!-- not run in tests: \S.* -->")
FENCE = re.compile(r"^```(\S*)\s*$")
README_GATEWAY = "127.0.0.1:8080"
README_KEYS_FILE = "/etc/ridge/keys.json"
READY_TIMEOUT_S = 90.0  # a demo is ready in ~3 s on an idle 2-core machine
BLOCK_TIMEOUT_S = 120.0  # each block takes a few seconds of simulated generation
CURLRC = "fail-with-body\nmax-time = 60\nconnect-timeout = 10\n"

EXPECTED: dict[str, tuple[str, ...]] = {
    # /v1/models lists the demo's model; the stream ends as OpenAI's streams end
    "curl -s http://127.0.0.1:8080/v1/models": (
        r'"id":\s*"smollm2-135m"', r'"object":\s*"chat\.completion"', r"data: \[DONE\]\s*$"),
    # the streamed answer is followed by its token count (the usage chunk arrived)
    "from openai import OpenAI": (r"\n\[\d+ tokens\]\s*$",),
    # "# rk-…  (printed once)": the new key, on a line of its own
    "ridge keys add team-a": (r"(?m)^rk-[\w-]{20,}$", r"(?m)^team-a\s", r"revoked 'team-a'"),
}
"""A command a block contains → patterns (``re.search``) its output must match."""

pytestmark = pytest.mark.timeout(300)


@dataclass(frozen=True)
class Block:
    """One fenced code block of the README: its info string, text and first line (1-based)."""

    info: str
    text: str
    line: int
    after: str  # the last non-blank line before the fence
    section: str  # the last ``## `` heading before it ("" in the preamble)

    @property
    def runs(self) -> bool:
        return (self.info in RUNNABLE and self.section != ""
                and SKIP_MARK.fullmatch(self.after.strip()) is None)


def blocks(text: str) -> Iterator[Block]:
    """Every fenced block of ``text`` (fences of three backticks, not nested)."""
    lines = text.splitlines()
    section, last, i = "", "", 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            if lines[i].startswith("## "):
                section = lines[i]
            last = lines[i] if lines[i].strip() else last
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        yield Block(opening.group(1), "\n".join(lines[i + 1:end]) + "\n", i + 1, last, section)
        last, i = lines[end], end + 1


def runnable() -> list[Block]:
    return [b for b in blocks(README.read_text()) if b.runs]


def substitutions(port: int, keys_file: Path) -> dict[str, str]:
    """The README's addresses and paths for the reader's machine → the test's."""
    return {README_GATEWAY: f"127.0.0.1:{port}", README_KEYS_FILE: str(keys_file)}


def environment(home: Path) -> dict[str, str]:
    """This environment without any RIDGE_ setting; .venv/bin first; the test's curl config."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("RIDGE_")}
    (home / ".curlrc").write_text(CURLRC)
    path = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return {**env, "PATH": path, "CURL_HOME": str(home)}


def command(block: Block, text: str, workdir: Path) -> list[str]:
    if block.info == "python":
        script = workdir / f"readme_{block.line}.py"
        script.write_text(text)
        return [sys.executable, str(script)]
    return ["bash", "-e", "-u", "-o", "pipefail", "-c", text]


def block_id(block: Block) -> str:
    return f"line{block.line}-{block.info}"


@dataclass(frozen=True)
class Demo:
    server: Server
    port: int


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """``ridge demo`` on a free port, ready, stopped after the module's tests."""
    logs = tmp_path_factory.mktemp("demo")
    port = free_port()
    argv = [str(ridge_binary()), "demo", "--host", "127.0.0.1", "--port", str(port)]
    env = {**environment(logs), "RIDGE_DRAIN_S": "0"}
    server = spawn("demo", argv, env, logs, f"http://127.0.0.1:{port}")
    try:
        wait_ready([server], "/ready", READY_TIMEOUT_S)
        yield Demo(server, port)
    finally:
        server.stop()


def test_the_readme_has_runnable_blocks_and_every_expectation_has_its_block() -> None:
    found = runnable()
    assert {b.info for b in found} >= {"sh", "python"}
    for snippet in EXPECTED:
        assert any(snippet in b.text for b in found), f"no runnable block runs {snippet!r}"
    skipped = [b for b in blocks(README.read_text()) if b.info in RUNNABLE and not b.runs]
    assert all(b.section == "" or SKIP_MARK.fullmatch(b.after.strip()) for b in skipped)


@pytest.mark.parametrize("block", runnable(), ids=block_id)
def test_a_readme_block_runs_as_written(block: Block, demo: Demo, tmp_path: Path) -> None:
    text = block.text
    for old, new in substitutions(demo.port, tmp_path / "keys.json").items():
        text = text.replace(old, new)
    done = subprocess.run(command(block, text, tmp_path), cwd=tmp_path,
                          env=environment(tmp_path), text=True, capture_output=True,
                          stdin=subprocess.DEVNULL, timeout=BLOCK_TIMEOUT_S, check=False)
    report = f"README.md line {block.line}:\n{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, f"exit status {done.returncode}, {report}"
    assert demo.server.alive(), f"the demo stopped:\n{demo.server.log_tail()}"
    for snippet, patterns in EXPECTED.items():
        if snippet in block.text:
            missing = [p for p in patterns if not re.search(p, done.stdout)]
            assert not missing, f"output does not match {missing}, {report}"
