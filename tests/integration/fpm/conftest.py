"""Fixtures for FPM transport tests: a ZMQ context for the publishers, a virtual clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq


class VirtualClock:
    """Seconds that move only when the test says so (staleness without sleeping)."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


@pytest.fixture
def zmq_context() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()
