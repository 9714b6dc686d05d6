"""Where the planner's replays run: local processes, or the workers of a Ray cluster.

Both are :class:`concurrent.futures.Executor` s, so :class:`gateway.plan.search.Search` does not
know which it has. :func:`local_executor` starts ``jobs`` fresh processes (spawned: nothing of
the caller's state is shared) that end when the planner's process does, however it ends
(on Linux the kernel signals them, :func:`die_with_parent`). :class:`RayExecutor` sends each
replay to a Ray cluster as a task (``ray.init(address)``; ``local`` starts a one-machine
instance) and hands back Ray's own futures; every node needs ridge installed, the same version
(a replay is a function of ridge's code and its arguments). Ray is an optional dependency:
``pip install 'ridge[ray]'``. docs/planning.md#more-than-one-machine.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
LOCAL = "local"
"""``--ray local``: a Ray instance on this machine, started for the plan and stopped after."""


PR_SET_PDEATHSIG = 1
"""prctl(2): the signal a process gets when its parent ends (Linux)."""


def local_executor(jobs: int) -> Executor:
    """``jobs`` worker processes, ending with this one (:func:`die_with_parent`)."""
    return ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=die_with_parent, initargs=(os.getpid(),))


def die_with_parent(parent: int) -> None:
    """In a worker: be sent SIGTERM when the process that started it ends, so that a planner
    killed (SIGTERM, SIGKILL, a crash) leaves no replays running. Linux only; elsewhere the
    pool's own shutdown is all there is."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it ended before the line above
        os._exit(1)


def _call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return fn(*args, **kwargs)


class RayExecutor(Executor):
    """Replays as Ray tasks on the cluster at ``address`` (:data:`LOCAL`: one started here),
    each taking ``cpus`` CPUs; ValueError when Ray is not installed or cannot connect."""

    def __init__(self, address: str, cpus: float = 1.0) -> None:
        try:
            import ray
        except ImportError:
            raise ValueError("--ray needs Ray: pip install 'ridge[ray]'") from None
        self._ray = ray
        try:
            ray.init(address=None if address == LOCAL else address, include_dashboard=False,
                     log_to_driver=False, logging_level=logging.WARNING,
                     configure_logging=False)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise ValueError(f"--ray {address}: {exc}") from None
        self._task = ray.remote(num_cpus=cpus)(_call)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = self._task.remote(fn, *args, **kwargs).future()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._ray.shutdown()
