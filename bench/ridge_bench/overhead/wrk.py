"""Closed-loop HTTP load with ``wrk`` (Debian package ``wrk``): fast enough (C, epoll) that
the gateway, not the client, is the bottleneck.

:func:`script` renders the Lua script: every request is the same POST (JSON body); a
``response`` hook counts every answer whose status is not 200 per thread, and ``done`` prints
one line ``RESULT {json}`` with the totals: responses, duration [s], latency p50/p99 [ms] (of
every response, as wrk records it), non-200 answers and socket errors (connect, read, write,
timeout). :func:`run` runs wrk (``-t 1 -c C -d S --timeout T``; wrk takes whole seconds, so
``S`` is rounded, at least 1), optionally pinned with ``taskset``, bounded by ``S + T + 30``
seconds, and parses that line into :class:`WrkResult`.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ridge_bench.harness.procs import pinned

_LUA = """
wrk.method = "POST"
wrk.body = [==[%BODY%]==]
wrk.headers["Content-Type"] = "application/json"

local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) non200 = 0 end
function response(status, headers, body)
  if status ~= 200 then non200 = non200 + 1 end
end
function done(summary, latency, requests)
  local bad = 0
  for _, t in ipairs(threads) do bad = bad + t:get("non200") end
  local e = summary.errors
  io.write(string.format(
    'RESULT {"responses": %d, "duration_s": %.6f, "p50_ms": %.4f, "p99_ms": %.4f, ' ..
    '"non200": %d, "connect": %d, "read": %d, "write": %d, "timeout": %d}\\n',
    summary.requests, summary.duration / 1e6, latency:percentile(50) / 1e3,
    latency:percentile(99) / 1e3, bad, e.connect, e.read, e.write, e.timeout))
end
"""


@dataclass(frozen=True)
class WrkResult:
    """One wrk run. ``responses`` includes non-200 answers; times in s and ms."""

    responses: int
    duration_s: float
    p50_ms: float
    p99_ms: float
    non200: int
    socket_errors: int

    @property
    def ok(self) -> int:
        return self.responses - self.non200

    @property
    def errors(self) -> int:
        """Every request that did not end in a 200: non-200 answers and socket errors."""
        return self.non200 + self.socket_errors

    @property
    def rps(self) -> float:
        return self.ok / self.duration_s if self.duration_s > 0 else 0.0


def available() -> bool:
    return shutil.which("wrk") is not None


def script(body: bytes) -> str:
    """The Lua script for POSTs of ``body`` (module doc)."""
    text = body.decode()
    if "]==]" in text:
        raise ValueError("body contains the Lua long-string terminator")
    return _LUA.replace("%BODY%", text)


def parse(output: str) -> WrkResult:
    """The ``RESULT`` line of wrk's output; ValueError if there is none."""
    for line in output.splitlines():
        if line.startswith("RESULT "):
            v = json.loads(line[len("RESULT "):])
            sockets = v["connect"] + v["read"] + v["write"] + v["timeout"]
            return WrkResult(v["responses"], v["duration_s"], v["p50_ms"], v["p99_ms"],
                             v["non200"], sockets)
    raise ValueError(f"no RESULT line in wrk's output:\n{output[-2000:]}")


async def run(url: str, script_path: Path, connections: int, seconds: float,
              timeout_s: float = 10.0, cpus: Sequence[int] | None = None,
              threads: int = 1) -> WrkResult:
    """``connections`` closed-loop connections on ``url`` for ``seconds`` from ``threads``
    wrk threads (module doc)."""
    seconds = max(1, round(seconds))
    argv = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{seconds}s",
            "--timeout", f"{max(1, round(timeout_s))}s", "-s", str(script_path), url]
    proc = await asyncio.create_subprocess_exec(
        *pinned(argv, cpus), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), seconds + timeout_s + 30.0)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError(
            f"wrk did not finish within {seconds + timeout_s + 30.0:.0f} s") from None
    return parse(out.decode(errors="replace"))
