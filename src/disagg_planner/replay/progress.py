"""The progress of a replay's simulations: one bar over all its policies, redrawn in place on
a terminal, a plain line every :data:`PLAIN_EVERY_S` of wall time otherwise (a log or a pipe
shows that a long run is alive, without carriage returns), and the line giving a run's size
before it starts. :func:`disagg_planner.replay.session.run` draws it for one policy,
:func:`disagg_planner.replay.parallel.run_policies` for several."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import TextIO

BAR_WIDTH = 30
# A redraw at most this often (s): a policy reports progress at every decision instant.
REDRAW_S = 0.2
# Without a terminal: a plain progress line this often (s of wall time).
PLAIN_EVERY_S = 30.0


def render_progress(
    done_s: float,
    total_s: float,
    elapsed_s: float,
    *,
    finished: int,
    runs: int,
    simulating_s: float | None = None,
) -> str:
    """One line: runs finished, a bar of simulated seconds done over all runs, the share
    done, the wall time so far and the time left at the rate so far (over
    ``simulating_s``, the wall time since the simulations began, when given)."""
    frac = min(1.0, done_s / total_s) if total_s > 0 else 1.0
    bar = "#" * int(frac * BAR_WIDTH)
    busy = elapsed_s if simulating_s is None else simulating_s
    if frac >= 1.0:
        eta = "0:00"
    elif done_s > 0 and busy > 0:
        eta = _clock(busy * (total_s - done_s) / done_s)
    else:
        eta = "--:--"
    return (
        f"replay {finished}/{runs} done [{bar:<{BAR_WIDTH}}] {frac:6.1%} "
        f"elapsed {_clock(elapsed_s)} ETA {eta}"
    )


def size_line(requests: int, span_s: float, policies: Sequence[str]) -> str:
    """What a replay is about to simulate, said before it starts."""
    named = ", ".join(policies)
    return (
        f"replay: {requests:,} requests arriving over {_clock(span_s)} of simulated time, "
        f"{len(policies)} {'policy' if len(policies) == 1 else 'policies'} ({named})"
    )


def _clock(seconds: float) -> str:
    whole = int(max(0.0, seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class RunProgress:
    """The progress of ``runs`` simulations of ``span_s`` simulated seconds each."""

    def __init__(
        self,
        runs: int,
        span_s: float,
        *,
        stream: TextIO | None = None,
        enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled
        # in a log or a pipe, carriage returns are noise: plain lines, every PLAIN_EVERY_S
        self.terminal = bool(getattr(self.stream, "isatty", lambda: False)())
        self.runs = runs
        self.span_s = span_s
        self.clock = clock
        self.started = clock()
        self.simulating_from: float | None = None  # the first report of a simulation
        self.done_s = [0.0] * runs
        self.finished = 0
        # the references' search is running: the ETA is the policies', not the search's
        self.searching = False
        self._drawn_at = -math.inf if self.terminal else self.started

    def note(self, text: str) -> None:
        """A line above the bar (a plain line without a terminal)."""
        if not self.enabled:
            return
        if self.terminal:
            self.stream.write(f"\r\x1b[K{text}\n")
            self._drawn_at = -math.inf
        else:
            self.stream.write(f"{text}\n")
        self.stream.flush()

    def update(self, run: int, now_s: float) -> None:
        if self.simulating_from is None:
            # the rate is that of the simulations: finding the references took time before
            self.simulating_from = self.clock()
        self.done_s[run] = min(self.span_s, max(self.done_s[run], now_s))
        self._draw()

    def finish(self, run: int) -> None:
        self.done_s[run] = self.span_s
        self.finished += 1
        self._draw(force=True)

    def tick(self) -> None:
        """Draw the line if it is due, though no simulated time has passed (a search)."""
        self._draw()

    def close(self) -> None:
        if self.enabled and self.terminal:
            self._draw(force=True)
            self.stream.write("\n")
            self.stream.flush()

    def callback(self, run: int) -> Callable[[float, float], None]:
        """What :func:`disagg_planner.replay.runner.run_policy` reports run ``run`` to."""
        return lambda now_s, _span_s: self.update(run, now_s)

    def _draw(self, *, force: bool = False) -> None:
        if not self.enabled:
            return
        now = self.clock()
        if self.terminal and not force and now - self._drawn_at < REDRAW_S:
            return
        if not self.terminal and now - self._drawn_at < PLAIN_EVERY_S:
            return  # a finished run waits for the next line too: a log is not a display
        self._drawn_at = now
        line = render_progress(
            sum(self.done_s),
            self.span_s * self.runs,
            now - self.started,
            finished=self.finished,
            runs=self.runs,
            simulating_s=None if self.simulating_from is None else now - self.simulating_from,
        )
        if self.searching:
            line += " (the references' search runs meanwhile; its log lines say where it is)"
        self.stream.write(f"\r{line}" if self.terminal else f"{line}\n")
        self.stream.flush()
