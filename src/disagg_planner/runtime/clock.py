"""The shell's clock: one float time line that ticks, observation windows and gauges share.

:class:`WallClock` reads ``time.monotonic()`` (so NTP steps never move a tick or a window
backwards) and maps it onto Unix seconds once, at construction: ``now = wall_0 + (mono -
mono_0)``. The values look like Unix time, which is what Prometheus' ``time=`` parameter and
the core's staleness check (``now - traffic.end_s``) expect, yet they never jump. Over weeks
the mapping can drift from the wall clock by the monotonic clock's rate error (parts per
million), which is far below any adjustment interval.

Tests use a clock whose :meth:`Clock.sleep_until` advances time at once (see
``tests/unit/runtime``). Replay runs the same loop on a :class:`DrivenClock`: the simulated
cluster's time, which only the replay runner moves, between ticks.

Blocking calls of a tick (an HTTP query, a file write) go through an :data:`Offload`:
``asyncio.to_thread`` live, so that the event loop keeps serving; :func:`inline` in replay,
whose sources and connector never block and run without an event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


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


class DrivenClock:
    """Time told by the driver of the shell (replay: the simulated cluster's ``now``).

    Only the driver moves it, and only between ticks; a shell that tried to wait on it would
    wait forever, so waiting raises.
    """

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now

    def now(self) -> float:
        return self._now()

    async def sleep(self, seconds: float) -> None:
        raise RuntimeError(f"cannot wait {seconds:g} s on a driven clock: its driver moves time")

    async def sleep_until(self, at_s: float, stop: asyncio.Event) -> bool:
        raise RuntimeError(f"cannot wait until {at_s:g} on a driven clock: its driver moves time")


class Offload(Protocol):
    """Runs one blocking call of a tick and awaits its result (``asyncio.to_thread`` live)."""

    def __call__(
        self, func: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> Awaitable[R]: ...


async def inline(func: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """Run ``func`` in place: for callers whose calls never block (replay)."""
    return func(*args, **kwargs)
