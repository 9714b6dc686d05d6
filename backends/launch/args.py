"""What every engine's launch-command renderer shares: secrets by reference, extra flags.

An engine command line is a list of :data:`Arg`: plain strings, and :class:`EnvRef` where a
value must come from an environment variable at launch time instead of being written out (the
engine API key of a pool's ``api_key_env``). Each consumer turns references into its own
syntax, so no rendered file ever holds a secret:

- a local process (:func:`resolve`): the variable's value, read from the environment given;
- a shell line (:func:`shell_join`): ``"$NAME"``;
- any other syntax (:func:`substitute`): a template such as ``${NAME}`` (compose) or
  ``$(NAME)`` (Kubernetes).

Each engine kind describes its launch for deployments as a :class:`Launcher` (the module run
with ``python -m``, its port, its flags, the GPUs one engine takes, its other ports).

A pool's ``engine_args`` are appended verbatim (:func:`extra_args`), except flags the renderer
sets itself (levers, host, port, served name, API key): those are refused, because an engine
whose flags contradict its pool's levers would make every routing decision wrong.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from config.engines import Role
from config.kv_events import KvEvents
from config.pools import Pool


@dataclass(frozen=True, slots=True)
class EnvRef:
    """An argument whose value is the environment variable ``name`` at launch time."""

    name: str


Arg = str | EnvRef
"""One command-line argument: literal, or taken from the environment at launch."""


class LaunchError(ValueError):
    """A pool that cannot be rendered into a launch command; the message says why."""


def resolve(argv: Sequence[Arg], env: Mapping[str, str]) -> list[str]:
    """``argv`` with every reference replaced by its value in ``env`` (a local process)."""
    missing = sorted({a.name for a in argv if isinstance(a, EnvRef) and a.name not in env})
    if missing:
        raise LaunchError(f"environment variables not set: {', '.join(missing)}")
    return [env[a.name] if isinstance(a, EnvRef) else a for a in argv]


def substitute(argv: Sequence[Arg], template: str) -> list[str]:
    """``argv`` with every reference written as ``template.format(name=...)``."""
    return [template.format(name=a.name) if isinstance(a, EnvRef) else a for a in argv]


def shell_join(argv: Sequence[Arg]) -> str:
    """One shell line: literals quoted, references as ``"$NAME"`` (expanded by the shell)."""
    return " ".join(f'"${a.name}"' if isinstance(a, EnvRef) else shlex.quote(a) for a in argv)


def env_refs(argv: Sequence[Arg]) -> list[str]:
    """The names of the variables ``argv`` refers to, in order, once each."""
    return list(dict.fromkeys(a.name for a in argv if isinstance(a, EnvRef)))


def api_key_args(pool: Pool, flag: str) -> list[Arg]:
    """``flag $VAR`` when the pool's engines take an API key from ``api_key_env``."""
    return [] if pool.api_key_env is None else [flag, EnvRef(pool.api_key_env)]


def flag_name(arg: str) -> str | None:
    """The flag an argument names (``--x`` of ``--x`` or ``--x=1``), None for a value."""
    if not arg.startswith("-") or arg == "-" or _is_number(arg):
        return None
    return arg.split("=", 1)[0]


def _is_number(arg: str) -> bool:
    try:
        float(arg)
    except ValueError:
        return False
    return True


def extra_args(pool: Pool, owned: Collection[str]) -> list[str]:
    """The pool's ``engine_args``, refusing any flag in ``owned`` (set by the renderer)."""
    named = (flag_name(a) for a in pool.engine_args)
    clash = sorted({f for f in named if f is not None and f in owned})
    if clash:
        raise LaunchError(f"pool {pool.name!r}: engine_args may not set {', '.join(clash)}: "
                          "the renderer sets them from the pool's levers and settings")
    return list(pool.engine_args)


def flags_set(args: Sequence[Arg], flags: Collection[str]) -> set[str]:
    """Which of ``flags`` stand in ``args`` (the ones a renderer set, so ``engine_args`` may
    not set them again)."""
    return {a for a in args if isinstance(a, str) and a in flags}


def flag_values(args: Sequence[str], flags: Collection[str]) -> list[str]:
    """The values given to any of ``flags`` in ``args`` (``--f v`` and ``--f=v`` forms)."""
    values = []
    for i, arg in enumerate(args):
        name = flag_name(arg)
        if name not in flags:
            continue
        if "=" in arg:
            values.append(arg.split("=", 1)[1])
        elif i + 1 < len(args):
            values.append(args[i + 1])
    return values


@dataclass(frozen=True, slots=True)
class Launcher:
    """One engine kind's launch recipe for a deployment: ``python -m module`` followed by
    ``args(pool, host, port, checkpoint)``; ``port`` its usual HTTP port; ``parallel`` the
    ``engine_args`` flags, one set per parallel dimension, whose values multiply into the GPUs
    one engine takes; ``side_ports`` the ports it also listens on, by pool role."""

    module: str
    port: int
    args: Callable[[Pool, str, int, str], list[Arg]]
    parallel: tuple[frozenset[str], ...]
    side_ports: Mapping[Role, Mapping[str, int]]

    def gpus(self, pool: Pool) -> int:
        """GPUs one engine of ``pool`` takes: the product of its parallel sizes (at least 1)."""
        sizes = [flag_values(pool.engine_args, flags) for flags in self.parallel]
        try:
            return math.prod(int(values[-1]) for values in sizes if values)
        except ValueError as exc:
            raise LaunchError(f"pool {pool.name!r}: a parallel size in engine_args is not a "
                              f"whole number: {exc}") from exc

    def command(self, python: str, pool: Pool, host: str, port: int,
                checkpoint: str) -> list[Arg]:
        """The whole argv of one engine."""
        return [python, "-m", self.module, *self.args(pool, host, port, checkpoint)]


def kv_events_args(pool: Pool, flag: str, data_parallel_flags: Collection[str],
                   config: Callable[[KvEvents], Mapping[str, Any]],
                   ports: tuple[int, int | None] | None = None) -> list[Arg]:
    """``flag`` and the JSON ``config`` of a pool's ``kv_events`` (the engine's own object);
    nothing without. ``ports``: this engine's (publish, replay) ports, None = the pool's. A
    pool whose ``engine_args`` set data parallelism (any of ``data_parallel_flags`` above 1) is
    refused: each rank publishes on a port of its own (PORT + rank), several streams behind one
    endpoint."""
    events = pool.kv_events
    if events is None:
        return []
    sizes = flag_values(pool.engine_args, data_parallel_flags)
    if sizes and sizes[-1] != "1":
        raise LaunchError(f"pool {pool.name!r}: with {sizes[-1]} data-parallel ranks each rank "
                          "publishes its KV events on a port of its own (PORT + rank), one "
                          "endpoint with several streams: run one engine per endpoint")
    if ports is not None:
        events = events.model_copy(update={"port": ports[0], "replay_port": ports[1]})
    return [flag, json.dumps(dict(config(events)))]
