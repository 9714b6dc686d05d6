"""A real ``redis-server`` for the tests: started on a free 127.0.0.1 port in a temporary
directory (no persistence: ``--save ""``, ``--appendonly no``), always stopped.

The binary is Debian's ``redis-server`` (``make test`` installs it; by hand:
``bash deploy/apt-install.sh redis-server``). When it is missing the tests FAIL saying so:
a skipped shared-state suite would hide that it never ran.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

INSTALL_HINT = ("redis-server is not installed: run `make test` or "
                "`bash deploy/apt-install.sh redis-server`")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class RedisServer:
    """One redis-server process; ``start`` again after ``stop`` reuses the same port."""

    maxmemory: str = "256mb"
    port: int = field(default_factory=_free_port)
    proc: subprocess.Popen[bytes] | None = None
    workdir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="ridge-redis-"))

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail(INSTALL_HINT)
        self.proc = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--maxmemory", self.maxmemory, "--dir", self.workdir,
             "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", self.port), timeout=0.2) as conn:
                conn.sendall(b"PING\r\n")
                if conn.recv(16).startswith(b"+PONG"):
                    return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not answer in time")

    def stop(self) -> None:
        """Kill the server (as a crash would) and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


@contextlib.contextmanager
def running_redis(maxmemory: str = "256mb") -> Iterator[RedisServer]:
    server = RedisServer(maxmemory=maxmemory)
    server.start()
    try:
        yield server
    finally:
        server.close()
