"""Engine-side FPM publishers for the tests: real ZMQ PUB sockets on loopback that send what
a Dynamo engine sends, ``[topic, sequence (8 bytes big-endian), msgpack payload]``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
import zmq

from disagg_planner.observe.fpm_subscriber import FpmSubscriber
from disagg_planner.signals.fpm import ForwardPassMetrics, encode
from tests.integration.conftest import free_port  # noqa: F401  (used by the FPM tests)
from tests.unit.regression.fpm_factory import fpm

T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], *, what: str, timeout_s: float = 10.0) -> T:
    """Poll ``probe`` until it returns something other than None (or fail naming ``what``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = probe()
        if result is not None:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.01)


class EnginePublisher:
    """One engine rank's FPM PUB socket; ``counter_id`` counts every message from 0."""

    def __init__(
        self, context: zmq.Context, *, worker: str, dp_rank: int = 0, port: int | None = None
    ) -> None:
        self.worker = worker
        self.dp_rank = dp_rank
        self.counter = 0
        self._sock = context.socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        if port is None:
            port = self._sock.bind_to_random_port("tcp://127.0.0.1")
        else:  # ZMQ releases a closed socket's port asynchronously: retry briefly
            wait_for(lambda: self._try_bind(port), what=f"port {port} to be free")
        self.port = port
        self.endpoint = f"tcp://127.0.0.1:{port}"

    def _try_bind(self, port: int) -> bool | None:
        try:
            self._sock.bind(f"tcp://127.0.0.1:{port}")
        except zmq.ZMQError:
            return None
        return True

    @property
    def key(self) -> tuple[str, int]:
        return (self.worker, self.dp_rank)

    def report(self, **fields: Any) -> ForwardPassMetrics:
        """Send one iteration (``fields`` as in ``fpm_factory.fpm``); returns what was sent."""
        message = fpm(worker=self.worker, dp_rank=self.dp_rank, counter=self.counter, **fields)
        self.send_payload(encode(message))
        return message

    def heartbeat(self) -> ForwardPassMetrics:
        return self.report(wall=0.0)

    def send_payload(self, payload: bytes) -> None:
        self._sock.send_multipart([b"", self.counter.to_bytes(8, "big"), payload])
        self.counter += 1

    def send_raw(self, *frames: bytes) -> None:
        self._sock.send_multipart(list(frames))

    def send_object(self, obj: object) -> None:
        """Send any msgpack-encodable object as the payload (malformed FPMs)."""
        self.send_payload(msgspec.msgpack.encode(obj))

    def close(self) -> None:
        self._sock.close(linger=0)


def connect(publisher: EnginePublisher, subscriber: FpmSubscriber, timeout_s: float = 10.0) -> None:
    """Send heartbeats until the subscriber lists the engine (ZMQ drops what a PUB sends
    before the SUB's subscription reaches it)."""

    def probe() -> bool | None:
        if publisher.key in subscriber.snapshot():
            return True
        publisher.heartbeat()
        return None

    wait_for(probe, what=f"subscriber to hear {publisher.endpoint}", timeout_s=timeout_s)
