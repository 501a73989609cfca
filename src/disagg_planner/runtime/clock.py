"""The shell's clock: one float time line that ticks, observation windows and gauges share.

:class:`WallClock` reads ``time.monotonic()`` (so NTP steps never move a tick or a window
backwards) and maps it onto Unix seconds once, at construction: ``now = wall_0 + (mono -
mono_0)``. The values look like Unix time, which is what Prometheus' ``time=`` parameter and
the core's staleness check (``now - traffic.end_s``) expect, yet they never jump. Over weeks
the mapping can drift from the wall clock by the monotonic clock's rate error (parts per
million), which is far below any adjustment interval.

Tests use a clock whose :meth:`Clock.sleep_until` advances time at once (see
``tests/unit/runtime``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Protocol


class Clock(Protocol):
    """Seconds on one time line, and a way to wait for an instant on it."""

    def now(self) -> float:
        """The current time (s)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (a connector's retry backoff)."""
        ...

    async def sleep_until(self, at_s: float, stop: asyncio.Event) -> bool:
        """Wait until ``at_s`` or until ``stop`` is set; True when stopped."""
        ...


class WallClock:
    """``time.monotonic()`` mapped onto Unix seconds at construction (see the module)."""

    def __init__(self) -> None:
        self._offset = time.time() - time.monotonic()

    def now(self) -> float:
        return self._offset + time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def sleep_until(self, at_s: float, stop: asyncio.Event) -> bool:
        delay = at_s - self.now()
        if stop.is_set():
            return True
        if delay <= 0:
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=delay)
        return stop.is_set()
