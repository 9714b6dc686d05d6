"""A plain-text progress bar on stderr (no dependency).

The bar fills with the larger of two fractions: requests sent / the request bound, and time
elapsed / the duration bound, since the run stops at whichever comes first; during the drain
(no more sending, waiting for answers) it shows the requests still in flight. On a terminal it
redraws one line (carriage return) at most every ``interval_s``; otherwise (a log file) it
writes a full line every ``log_interval_s``, so logs stay short.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO


@dataclass(frozen=True, slots=True)
class Counts:
    """The run so far: requests sent, finished, succeeded, failed; seconds elapsed."""

    sent: int
    done: int
    ok: int
    errors: int
    elapsed_s: float
    draining: bool = False


class Progress:
    """Draws :class:`Counts` against the bounds ``total`` requests and ``duration_s`` seconds."""

    def __init__(self, label: str, total: int, duration_s: float, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic, width: int = 24,
                 interval_s: float = 0.5, log_interval_s: float = 10.0) -> None:
        self._label, self._total, self._duration = label, total, duration_s
        self._stream = stream if stream is not None else sys.stderr
        self._tty = self._stream.isatty()
        self._clock, self._width = clock, width
        self._every = interval_s if self._tty else log_interval_s
        self._last = -float("inf")
        self._drawn = False

    def line(self, c: Counts) -> str:
        """The text of the bar for ``c``."""
        frac = min(1.0, max(c.sent / self._total, c.elapsed_s / self._duration))
        filled = round(frac * self._width)
        bar = "#" * filled + "." * (self._width - filled)
        state = f"draining {c.sent - c.done} in flight" if c.draining else \
            f"{c.sent - c.done} in flight"
        return (f"{self._label} [{bar}] {c.sent}/{self._total} sent {c.elapsed_s:5.1f}/"
                f"{self._duration:.0f} s  {state}  ok {c.ok}  err {c.errors}")

    def show(self, c: Counts, force: bool = False) -> None:
        """Draw ``c`` unless the last drawing is more recent than the interval."""
        now = self._clock()
        if not force and now - self._last < self._every:
            return
        self._last = now
        end = "" if self._tty else "\n"
        prefix = "\r\x1b[2K" if self._tty else ""
        self._stream.write(prefix + self.line(c) + end)
        self._stream.flush()
        self._drawn = True

    def close(self, c: Counts) -> None:
        """Draw the final state and end the line."""
        self.show(c, force=True)
        if self._tty and self._drawn:
            self._stream.write("\n")
            self._stream.flush()
