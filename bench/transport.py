"""Benchmark of ridge's upstream transports: ``python -m bench.transport``.

Three kinds of process share the machine: the fake engine (:mod:`bench.upstream`), ridge
(one process per target: the throughput targets all run for the whole throughput part, idle
but for the one being measured; every stream variant gets its own) and this process, which
drives the load (:mod:`bench.load`) and writes the report (:mod:`bench.report`).

1. Throughput: for every target in :data:`TARGETS` (``direct`` to the fake engine is the
   baseline) and every level of ``--concurrency``, ``--rounds`` times (targets interleaved):
   ``--warmup`` seconds uncounted, then ``--seconds`` seconds of closed-loop non-streaming
   chat completions (each request bounded by ``--timeout``, each cell by ``--max-requests``):
   requests/s, p50/p99 latency, errors, and the CPU every process used.
2. Relay delay: for every variant in :data:`STREAMS`, ``--streams`` paced streams in a row
   (``--chunks`` chunks, ``--interval-ms`` apart; each cell bounded by ``--stream-seconds``):
   TTFT and per-chunk delivery delay through ridge vs direct, with TCP_NODELAY as shipped and
   turned OFF on ridge's sockets (:mod:`bench.ridge_variant`), and the TCP_NODELAY values
   ridge's sockets really had (logged by the variant's probe).

Every server binds 127.0.0.1. A default run takes about three minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import re
import sys
import tempfile
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bench.load import LoadResult, drive, load_session, run_streams
from bench.procs import ROOT, Child, machine_busy_seconds, start_ridge, start_upstream
from bench.report import (
    StreamRow,
    ThroughputRow,
    generated_block,
    machine_facts,
    stream_table,
    throughput_table,
    verdict,
    write_doc,
)
from bench.upstream import MODEL

T = TypeVar("T")


@dataclass(frozen=True)
class Target:
    """A way to reach the fake engine. ``env`` is ridge's environment; ``variant`` the
    arguments of :mod:`bench.ridge_variant` (None: the real ``ridge serve``); ``needs`` an
    optional module without which the target is skipped."""

    key: str
    name: str
    direct: bool = False
    env: tuple[tuple[str, str], ...] = ()
    variant: tuple[str, ...] | None = None
    needs: str | None = None


def _ridge(transport: str) -> tuple[tuple[str, str], ...]:
    return (("RIDGE_UPSTREAM__TRANSPORT", transport),)


TARGETS = (
    Target("direct", "direct (no ridge)", direct=True),
    Target("aiohttp", "ridge + aiohttp", env=_ridge("aiohttp")),
    Target("httpx", "ridge + httpx", env=_ridge("httpx")),
    Target("httpx-aiohttp", "ridge + httpx-aiohttp (bench)",
           variant=("--transport", "httpx-aiohttp"), needs="httpx_aiohttp"),
    Target("aiohttp-uvloop", "ridge + aiohttp on uvloop (bench)",
           variant=("--transport", "aiohttp", "--loop", "uvloop"), needs="uvloop"),
)


def _stream(key: str, transport: str, off: str, name: str, needs: str | None = None) -> Target:
    args = ("--transport", transport, "--nodelay-off", off, "--probe")
    return Target(key, name, variant=args, needs=needs)


STREAMS = (
    Target("direct", "direct (no ridge)", direct=True),
    _stream("aiohttp", "aiohttp", "none", "ridge + aiohttp, NODELAY as shipped"),
    _stream("aiohttp-ridge-code", "aiohttp", "ridge-code",
            "ridge + aiohttp, ridge's own NODELAY calls removed"),
    _stream("aiohttp-off", "aiohttp", "both", "ridge + aiohttp, NODELAY off both sides"),
    _stream("aiohttp-off-down", "aiohttp", "down", "ridge + aiohttp, NODELAY off to client"),
    _stream("aiohttp-off-up", "aiohttp", "up", "ridge + aiohttp, NODELAY off to engine"),
    _stream("httpx", "httpx", "none", "ridge + httpx, NODELAY as shipped"),
    _stream("httpx-off", "httpx", "both", "ridge + httpx, NODELAY off both sides"),
    _stream("httpx-off-up", "httpx", "up", "ridge + httpx, NODELAY off to engine"),
    _stream("httpx-aiohttp", "httpx-aiohttp", "none", "ridge + httpx-aiohttp (bench)",
            needs="httpx_aiohttp"),
)

_RIDGE_ENV = {"RIDGE_LOG_LEVEL": "warning"}  # no access log line per request

FLEET_YAML = """\
pools:
  - name: bench
    engine: vllm
    models: [{model}]
    endpoints: [{url}]
    model: {{params: 1.0e8, layers: 2, hidden_size: 64, kv_heads: 1, head_dim: 64,
             dtype_bytes: 2}}
    hardware: {{name: bench, peak_flops: 1.0e12, mem_bandwidth: 1.0e10}}
"""


@dataclass(frozen=True)
class Run:
    """What one benchmark run shares: the upstream, the fleet file, the options."""

    upstream: Child
    workdir: Path
    fleet: Path
    args: argparse.Namespace
    facts: list[str] = field(default_factory=list)


def _available(target: Target) -> bool:
    return target.needs is None or importlib.util.find_spec(target.needs) is not None


async def _start(run: Run, target: Target) -> Child | None:
    if target.direct:
        return None
    env = {**_RIDGE_ENV, **dict(target.env)}
    return await start_ridge(target.key, run.workdir, run.fleet, env, target.variant,
                             run.args.start_timeout)


def _cpu(upstream: Child, ridge: Child | None) -> list[float | None]:
    """CPU seconds so far: this process, the upstream, ridge, the whole machine."""
    return [time.process_time(), upstream.cpu_seconds(), ridge.cpu_seconds() if ridge else None,
            machine_busy_seconds()]


def _plus_delta(total: float | None, before: float | None, after: float | None) -> float | None:
    if total is None or before is None or after is None:
        return None
    return total + after - before


@dataclass
class CellSum:
    """One (target, concurrency) cell summed over the rounds; ``cpu_s`` as from :func:`_cpu`."""

    result: LoadResult = field(default_factory=LoadResult)
    cpu_s: list[float | None] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])

    def add(self, result: LoadResult, before: list[float | None],
            after: list[float | None]) -> None:
        self.result.merge(result)
        parts = zip(self.cpu_s, before, after, strict=True)
        self.cpu_s = [_plus_delta(total, b, a) for total, b, a in parts]

    def row(self, name: str, level: int) -> ThroughputRow:
        """Percent of one core per process; the machine's total less ours is 'others'."""
        wall, used = self.result.wall_s, list(self.cpu_s)
        if used[-1] is not None:
            used[-1] = max(0.0, used[-1] - sum(u for u in used[:-1] if u is not None))
        pct = tuple(None if u is None or wall <= 0 else 100.0 * u / wall for u in used)
        ridge_s = used[2]
        ok = self.result.ok
        return ThroughputRow(name, level, self.result, pct,
                             ridge_s / ok * 1e6 if ridge_s is not None and ok else None)


async def _cell(run: Run, ridge: Child | None, level: int, into: CellSum) -> LoadResult:
    """One warm-up, then one measured drive of ``level`` workers, added to ``into``."""
    url = (ridge or run.upstream).url + "/v1/chat/completions"
    async with load_session(level, run.args.timeout) as session:
        await drive(session, url, level, run.args.warmup, run.args.max_requests)
        before = _cpu(run.upstream, ridge)
        result = await drive(session, url, level, run.args.seconds, run.args.max_requests)
        into.add(result, before, _cpu(run.upstream, ridge))
    return result


def _loop_fact(target: Target, ridge: Child) -> str:
    """Which event loop the real ``ridge serve`` process runs on, as seen from outside."""
    loaded = ridge.has_loaded("uvloop")
    state = {True: "is", False: "is not", None: "may or may not be"}[loaded]
    return (f"- {target.name} (the real `ridge serve`): uvloop {state} loaded in the ridge "
            "process (`gateway/cli.py` runs `asyncio.run`, so asyncio's own loop)")


async def _rounds(run: Run, targets: Sequence[Target],
                  ridges: dict[str, Child | None]) -> list[ThroughputRow]:
    """Every cell ``rounds`` times, targets interleaved (order reversed every other round)
    so that other load on the machine falls on all targets alike."""
    sums = {(t.key, level): CellSum() for t in targets for level in run.args.concurrency}
    for number in range(run.args.rounds):
        order = targets if number % 2 == 0 else list(reversed(targets))
        for level in run.args.concurrency:
            for target in order:
                res = await _cell(run, ridges[target.key], level, sums[(target.key, level)])
                print(f"round {number + 1}: {target.name}, concurrency {level}: "
                      f"{res.ok / max(res.wall_s, 1e-9):,.0f} req/s, "
                      f"{res.error_count} errors", flush=True)
    return [sums[(t.key, level)].row(t.name, level)
            for t in targets for level in run.args.concurrency]


async def _throughput(run: Run, targets: Sequence[Target]) -> list[ThroughputRow]:
    """Start one ridge per target, run the rounds, stop them all."""
    ridges: dict[str, Child | None] = {}
    try:
        for target in targets:
            ridges[target.key] = ridge = await _start(run, target)
            if ridge is not None and target.variant is None:
                run.facts.append(_loop_fact(target, ridge))
        return await _rounds(run, targets, ridges)
    finally:
        for child in ridges.values():
            if child is not None:
                await child.stop()


def nodelay_seen(log_text: str) -> str:
    """The TCP_NODELAY values ridge's probe saw, by socket role: 'down 1, up 0'."""
    seen: dict[str, set[str]] = {}
    for role, value in re.findall(r"bench-nodelay role=(\w+) nodelay=(\d)", log_text):
        seen.setdefault(role, set()).add(value)
    if not seen:
        return "not observed"
    return ", ".join(f"{role} {'/'.join(sorted(v))}" for role, v in sorted(seen.items()))


async def _streams(run: Run, target: Target) -> StreamRow:
    ridge = await _start(run, target)
    try:
        url = (ridge or run.upstream).url + "/v1/chat/completions"
        result = await run_streams(url, run.args.streams, run.args.stream_seconds,
                                   run.args.timeout)
    finally:
        if ridge:
            await ridge.stop()
    seen = "n/a (no relay)" if ridge is None else nodelay_seen(ridge.log_path.read_text())
    row = StreamRow(target.name, seen, result, baseline=target.direct)
    print("\n".join(stream_table([row], None)[2:]), flush=True)
    return row


def _selected(table: Sequence[Target], keys: Sequence[str]) -> list[Target]:
    chosen = [t for t in table if t.key in keys]
    skipped = [t.key for t in chosen if not _available(t)]
    if skipped:
        print(f"skipped (module not installed): {', '.join(skipped)}", flush=True)
    return [t for t in chosen if _available(t)]


async def measure(
    args: argparse.Namespace,
) -> tuple[list[ThroughputRow], list[StreamRow], list[str]]:
    """Start the fake engine, run every throughput cell and stream variant, stop it all."""
    with tempfile.TemporaryDirectory(prefix="ridge-bench-") as tmp:
        workdir = Path(tmp)
        upstream = await start_upstream(workdir, args.chunks, args.interval_ms,
                                        args.start_timeout)
        try:
            fleet = workdir / "fleet.yaml"
            fleet.write_text(FLEET_YAML.format(model=MODEL, url=upstream.url))
            run = Run(upstream, workdir, fleet, args)
            load_rows = await _throughput(run, _selected(TARGETS, args.targets))
            streams = _selected(STREAMS, args.stream_variants)
            stream_rows = [await _streams(run, t) for t in streams]
        finally:
            await upstream.stop()
    return load_rows, stream_rows, run.facts


def _sections(args: argparse.Namespace, load_rows: Sequence[ThroughputRow],
              stream_rows: Sequence[StreamRow], facts: Sequence[str]) -> list[str]:
    out = [*facts, "", "All three processes (load client, fake engine, ridge) share the same "
           "2 cores, so the client and the fake engine take CPU from ridge: `direct` is the "
           "ceiling of client + engine on this machine, not a ridge figure. ridge runs with "
           "`RIDGE_LOG_LEVEL=warning` (no access-log line per request)."]
    if load_rows:
        out += ["", f"### Throughput: non-streaming chat completion, closed loop, "
                f"{args.rounds} × {args.seconds:g} s per cell (each after {args.warmup:g} s "
                "warm-up; targets interleaved)", "",
                *throughput_table(load_rows), "",
                "Latency: successful requests only. Errors: every non-200 and every exception "
                f"(each request bounded by {args.timeout:g} s).",
                "", "### Verdict (computed from the table)", "",
                *verdict(load_rows, "ridge + aiohttp", "ridge + httpx"),
                *verdict(load_rows, "ridge + httpx-aiohttp (bench)", "ridge + httpx"),
                *verdict(load_rows, "ridge + aiohttp on uvloop (bench)", "ridge + aiohttp")]
    if stream_rows:
        out += ["", f"### Relay delay: paced SSE stream, {args.chunks} chunks every "
                f"{args.interval_ms:g} ms, streams in a row on one keep-alive connection", "",
                *stream_table(stream_rows, next((r for r in stream_rows if r.baseline), None)),
                "",
                "TTFT: request sent → first content chunk received. Chunk delay: the engine's "
                "send stamp → arrival at the client (same monotonic clock). Gap: between two "
                "consecutive chunks at the client (paced "
                f"{args.interval_ms:g} ms apart). All in ms. "
                "`TCP_NODELAY in force` is what ridge's sockets really had at their first write "
                "(down = client side, up = engine side)."]
    return out


_HEAD = "# ridge upstream transport benchmark\n\n"
_TAIL = "\n\n## Discussion\n\n(Written by hand after a run.)\n"


def _levels(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _keys(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.transport",
                                description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=3.0,
                   help="measured seconds per cell and round")
    p.add_argument("--rounds", type=int, default=2, help="interleaved repeats of every cell")
    p.add_argument("--warmup", type=float, default=0.5,
                   help="uncounted seconds before every measured cell")
    p.add_argument("--concurrency", type=_levels, default=[1, 64, 256])
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    p.add_argument("--max-requests", type=int, default=200_000, help="per cell")
    p.add_argument("--targets", type=_keys, default=[t.key for t in TARGETS])
    p.add_argument("--stream-variants", type=_keys, default=[t.key for t in STREAMS])
    p.add_argument("--streams", type=int, default=12, help="paced streams per variant")
    p.add_argument("--stream-seconds", type=float, default=8.0, help="bound per variant")
    p.add_argument("--chunks", type=int, default=20)
    p.add_argument("--interval-ms", type=float, default=20.0)
    p.add_argument("--start-timeout", type=float, default=20.0, help="seconds per process")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "transport.md")
    p.add_argument("--no-write", action="store_true", help="print only")
    return p


def _run_loop(work: Coroutine[Any, Any, T]) -> T:
    """The load client runs on uvloop when installed (a faster client leaves more CPU)."""
    if importlib.util.find_spec("uvloop") is None:
        return asyncio.run(work)
    import uvloop

    return uvloop.run(work)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    load_rows, stream_rows, facts = _run_loop(measure(args))
    command = " ".join(["python -m bench.transport", *argv])
    sections = _sections(args, load_rows, stream_rows, facts)
    block = generated_block(command, machine_facts(), sections)
    print(block)
    if not args.no_write:
        write_doc(args.out, block, _HEAD, _TAIL)
        print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
