"""The stderr progress bar: its text, throttling, and terminal vs log output."""

from __future__ import annotations

import io

from ridge_bench.harness.progress import Counts, Progress


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_fills_with_the_larger_of_requests_and_time() -> None:
    p = Progress("agent", total=100, duration_s=60.0, stream=io.StringIO(), width=10)
    assert "[##........] 20/100 sent" in p.line(Counts(20, 10, 9, 1, 6.0))  # 20 % of requests
    assert "[#####.....]" in p.line(Counts(20, 10, 9, 1, 30.0))  # 50 % of the time
    line = p.line(Counts(20, 10, 9, 1, 30.0))
    assert "10 in flight" in line and "ok 9" in line and "err 1" in line
    assert "draining 3 in flight" in p.line(Counts(100, 97, 97, 0, 61.0, draining=True))
    assert "[##########]" in p.line(Counts(100, 97, 97, 0, 61.0, draining=True))


def test_a_terminal_redraws_one_line_at_most_every_interval() -> None:
    now = [0.0]
    out = Tty()
    p = Progress("rag", 10, 10.0, stream=out, clock=lambda: now[0], interval_s=0.5)
    p.show(Counts(1, 0, 0, 0, 0.0))
    now[0] = 0.2
    p.show(Counts(2, 0, 0, 0, 0.2))  # too soon: not drawn
    now[0] = 0.6
    p.show(Counts(3, 0, 0, 0, 0.6))
    p.close(Counts(3, 3, 3, 0, 0.7))
    text = out.getvalue()
    assert text.count("\r") == 3 and " 2/10 sent" not in text and text.endswith("\n")


def test_a_log_gets_whole_lines_seldom() -> None:
    now = [0.0]
    out = io.StringIO()
    p = Progress("chat", 10, 10.0, stream=out, clock=lambda: now[0], log_interval_s=10.0)
    for t in range(0, 25):
        now[0] = float(t)
        p.show(Counts(t, 0, 0, 0, float(t)))
    assert out.getvalue().count("\n") == 3  # at 0, 10 and 20 s
    assert "\r" not in out.getvalue()
