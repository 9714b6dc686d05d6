"""``python -m backends.sim --config FILE [--speed X] [--seed S]``: serve a simulated fleet.

Starts every endpoint of the fleet file, prints one line per endpoint, and runs until interrupted
(SIGINT/SIGTERM). ``--speed`` compresses time (a step of T simulated seconds sleeps T / speed);
``--seed`` fixes every random draw.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Sequence

from backends.sim.fleet import start_fleet
from config.fleet import FleetConfigError, load_fleet


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m backends.sim", description=__doc__)
    parser.add_argument("--config", required=True, help="fleet YAML file")
    parser.add_argument("--speed", type=float, default=1.0, help="time compression (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    args = parser.parse_args(argv)
    if args.speed <= 0:
        parser.error("--speed must be positive")
    return args


async def serve(config: str, speed: float, seed: int) -> None:
    fleet = load_fleet(config)
    running = await start_fleet(fleet, speed=speed, seed=seed)
    for server in running.servers:
        ep = server.endpoint
        source = ep.pool.kv_event_sources([server.configured_url]).get(server.configured_url)
        events = f" kv_events={source.publish}" if source is not None else ""
        print(
            f"{server.url}  pool={ep.pool.name} engine={ep.pool.engine.value} "
            f"role={ep.pool.role.value} models={','.join(ep.pool.models)}{events}",
            flush=True,
        )
    print(f"simulating {len(running.servers)} endpoints at speed {speed}; Ctrl-C stops", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await running.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    try:
        asyncio.run(serve(args.config, args.speed, args.seed))
    except FleetConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
