"""Receive ForwardPassMetrics from engine publishers over ZMQ PUB/SUB.

Each engine rank binds a ZMQ PUB socket (vLLM under Dynamo: port 20380 + rank by default,
``DYN_VLLM_FORWARDPASS_METRIC_PORT``) and sends one multipart message per scheduler iteration,
``[topic, sequence (8 bytes), payload]``, plus heartbeats while idle. The payload is the
last frame; :func:`disagg_planner.signals.fpm.decode` turns it into a :class:`ForwardPassMetrics`
or a bounded error kind.

:class:`FpmSubscriber` keeps one SUB socket per endpoint (so a removed endpoint's engines can
be dropped at once and a bad frame's sender can be named) and reads them on one background
thread, which never touches the asyncio event loop: every public method only takes a short
lock. It keeps:

- the latest report and the time it arrived per ``(worker_id, dp_rank)``; an engine silent
  for ``staleness_s`` is expired by :meth:`snapshot`;
- a bounded window of busy (non-heartbeat) reports for the regression, taken by
  :meth:`drain_samples` (the oldest are dropped and counted when nobody drains);
- counters: frames dropped by kind (:attr:`dropped`), and :meth:`counters` with frames
  received, messages the publishers sent that never arrived (gaps in ``counter_id``), engines
  expired and connection failures. Bad frames are logged at most once per ``warn_interval_s``
  per kind, with the number suppressed in between.

Endpoints come from a static list (config ``prefill_fpm_endpoints`` / ``decode_fpm_endpoints``)
and can be changed while running with :meth:`add_endpoint`, :meth:`remove_endpoint` or
:meth:`set_endpoints` (what a Kubernetes discovery loop calls).
"""

from __future__ import annotations

import collections
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from types import TracebackType

import zmq

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.signals.fpm import ForwardPassMetrics, FpmDecodeError, decode

log = logging.getLogger(__name__)

EngineKey = tuple[str, int]

DROP_KINDS = ("undecodable", "wrong_type", "unsupported_version", "invalid_value")
"""Kinds of frames dropped on decode (bounded: usable as a metric label)."""

_ENDPOINT = re.compile(r"(tcp://([^\s:/]+|\[[0-9a-fA-F:]+\]):\d{1,5}|ipc://\S+|inproc://\S+)")
_RECV_BATCH = 1000  # messages read per socket per loop turn, so endpoint changes still apply
_RETRY_CONNECT_S = 5.0


class _Throttle:
    """At most one log line per kind per interval, reporting how many were suppressed."""

    def __init__(self, interval_s: float) -> None:
        self._interval_s = interval_s
        self._last: dict[str, float] = {}
        self._suppressed: collections.Counter[str] = collections.Counter()

    def warn(self, kind: str, message: str, *args: object) -> None:
        now = time.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last < self._interval_s:
            self._suppressed[kind] += 1
            return
        suppressed = self._suppressed.pop(kind, 0)
        self._last[kind] = now
        suffix = f" ({suppressed} more suppressed)" if suppressed else ""
        log.warning(message + suffix, *args)


class FpmSubscriber:
    """Latest ForwardPassMetrics per engine from a changing set of ZMQ publishers.

    ``clock`` stamps arrivals (seconds; monotonic by default) and is the clock of
    :meth:`snapshot`'s ``now_s`` and of :meth:`last_seen`.
    """

    def __init__(
        self,
        *,
        endpoints: Iterable[str] = (),
        staleness_s: float = 10.0,
        max_samples: int = 16384,
        warn_interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        poll_interval_s: float = 0.05,
        name: str = "fpm",
    ) -> None:
        if not staleness_s > 0:
            raise ValueError(f"staleness_s must be > 0, got {staleness_s}")
        if max_samples < 1:
            raise ValueError(f"max_samples must be >= 1, got {max_samples}")
        if not poll_interval_s > 0:
            raise ValueError(f"poll_interval_s must be > 0, got {poll_interval_s}")
        self.staleness_s = staleness_s
        self.clock = clock
        self.name = name
        self._poll_ms = max(1, int(poll_interval_s * 1000))
        self._lock = threading.Lock()
        self._wanted: set[str] = set()
        self._latest: dict[EngineKey, ForwardPassMetrics] = {}
        self._seen: dict[EngineKey, float] = {}
        self._origin: dict[EngineKey, str] = {}
        self._samples: collections.deque[ForwardPassMetrics] = collections.deque(maxlen=max_samples)
        self._dropped = dict.fromkeys((*DROP_KINDS, "sample_overflow"), 0)
        self._counts = dict.fromkeys(
            ("received", "heartbeats", "missed", "expired_engines", "connect_failed"), 0
        )
        self._throttle = _Throttle(warn_interval_s)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._context: zmq.Context | None = None
        for endpoint in endpoints:
            self.add_endpoint(endpoint)

    @classmethod
    def from_config(cls, config: PlannerConfig, role: str) -> FpmSubscriber:
        """A subscriber for one role's engines (``agg`` reads the decode endpoints)."""
        endpoints = (
            config.prefill_fpm_endpoints if role == "prefill" else config.decode_fpm_endpoints
        )
        return cls(endpoints=endpoints, staleness_s=config.fpm_staleness_seconds, name=role)

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the receiver thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._context = zmq.Context()
        self._thread = threading.Thread(
            target=self._run, args=(self._context,), name=f"fpm-subscriber-{self.name}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the receiver thread and close every socket; safe to call twice."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():  # pragma: no cover - the loop wakes every poll interval
                log.error("FPM subscriber %s did not stop within %.1f s", self.name, timeout_s)
                return
        if self._context is not None:
            self._context.term()
            self._context = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> FpmSubscriber:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- endpoints ------------------------------------------------------------------------
    def add_endpoint(self, endpoint: str) -> None:
        """Subscribe to one more publisher (``tcp://host:port`` or ``ipc://path``)."""
        if not _ENDPOINT.fullmatch(endpoint):
            raise ValueError(
                f"FPM endpoint {endpoint!r} is not a ZMQ endpoint such as tcp://10.0.0.5:20380"
            )
        with self._lock:
            self._wanted.add(endpoint)

    def remove_endpoint(self, endpoint: str) -> None:
        """Unsubscribe; the engines heard only through it are forgotten at once."""
        with self._lock:
            self._wanted.discard(endpoint)
            self._forget_origin(endpoint)

    def set_endpoints(self, endpoints: Iterable[str]) -> None:
        """Replace the whole set (a discovery loop's view of the live publishers)."""
        new = set(endpoints)
        for endpoint in new:
            if not _ENDPOINT.fullmatch(endpoint):
                raise ValueError(f"FPM endpoint {endpoint!r} is not a ZMQ endpoint")
        with self._lock:
            for gone in self._wanted - new:
                self._forget_origin(gone)
            self._wanted = new

    @property
    def endpoints(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._wanted)

    def _forget_origin(self, endpoint: str) -> None:
        for key in [k for k, origin in self._origin.items() if origin == endpoint]:
            self._latest.pop(key, None)
            self._seen.pop(key, None)
            self._origin.pop(key, None)

    # --- reading --------------------------------------------------------------------------
    def snapshot(self, now_s: float | None = None) -> dict[EngineKey, ForwardPassMetrics]:
        """The latest report of every live engine; engines silent for more than
        ``staleness_s`` before ``now_s`` (default: the clock now) are expired."""
        now = self.clock() if now_s is None else now_s
        with self._lock:
            stale = [k for k, seen in self._seen.items() if now - seen > self.staleness_s]
            for key in stale:
                del self._latest[key], self._seen[key]
                self._origin.pop(key, None)
            self._counts["expired_engines"] += len(stale)
            return dict(self._latest)

    def by_endpoint(self, now_s: float | None = None) -> dict[str, list[ForwardPassMetrics]]:
        """:meth:`snapshot` grouped by the publisher each report came from."""
        latest = self.snapshot(now_s)
        with self._lock:
            origin = dict(self._origin)
        out: dict[str, list[ForwardPassMetrics]] = {}
        for key, fpm in latest.items():
            if key in origin:
                out.setdefault(origin[key], []).append(fpm)
        return out

    def last_seen(self) -> dict[EngineKey, float]:
        """When each known engine was last heard from, on :attr:`clock`."""
        with self._lock:
            return dict(self._seen)

    def drain_samples(self) -> list[ForwardPassMetrics]:
        """Busy iteration reports received since the last drain, oldest first."""
        with self._lock:
            samples = list(self._samples)
            self._samples.clear()
            return samples

    @property
    def dropped(self) -> dict[str, int]:
        """Frames dropped, by kind (:data:`DROP_KINDS`, plus ``sample_overflow``: busy
        reports pushed out of the sample window before anyone drained them)."""
        with self._lock:
            return dict(self._dropped)

    def counters(self) -> dict[str, int]:
        """Frames received and heartbeats among them, messages ``missed`` (publisher-side
        gaps in ``counter_id``), engines expired, failed connects."""
        with self._lock:
            return dict(self._counts)

    # --- the receiver thread --------------------------------------------------------------
    def _run(self, context: zmq.Context) -> None:
        sockets: dict[str, zmq.Socket] = {}
        failed_at: dict[str, float] = {}
        poller = zmq.Poller()
        try:
            while not self._stop.is_set():
                self._sync_sockets(context, poller, sockets, failed_at)
                if not sockets:
                    # zmq.Poller with nothing registered returns at once: without this wait
                    # a subscriber that has no (reachable) endpoint spins a whole core
                    self._stop.wait(self._poll_ms / 1000.0)
                    continue
                endpoint_of = {sock: endpoint for endpoint, sock in sockets.items()}
                for sock, _ in poller.poll(self._poll_ms):
                    endpoint = endpoint_of[sock]
                    for _ in range(_RECV_BATCH):
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._handle(endpoint, frames)
        except Exception:  # pragma: no cover - a bug here must not die silently
            log.exception("FPM subscriber %s stopped on an unexpected error", self.name)
        finally:
            for sock in sockets.values():
                sock.close(linger=0)

    def _sync_sockets(
        self,
        context: zmq.Context,
        poller: zmq.Poller,
        sockets: dict[str, zmq.Socket],
        failed_at: dict[str, float],
    ) -> None:
        with self._lock:
            wanted = set(self._wanted)
        for endpoint in [e for e in sockets if e not in wanted]:
            sock = sockets.pop(endpoint)
            poller.unregister(sock)
            sock.close(linger=0)
        now = time.monotonic()
        for endpoint in wanted - sockets.keys():
            if now - failed_at.get(endpoint, -_RETRY_CONNECT_S) < _RETRY_CONNECT_S:
                continue
            sock = context.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            try:
                sock.connect(endpoint)  # ZMQ reconnects by itself when the publisher restarts
            except zmq.ZMQError as exc:
                sock.close(linger=0)
                failed_at[endpoint] = now
                with self._lock:
                    self._counts["connect_failed"] += 1
                self._throttle.warn(
                    "connect", "FPM subscriber cannot connect to %s: %s", endpoint, exc
                )
                continue
            sockets[endpoint] = sock
            poller.register(sock, zmq.POLLIN)

    def _handle(self, endpoint: str, frames: list[bytes]) -> None:
        result = decode(frames[-1]) if frames else FpmDecodeError("undecodable", "empty message")
        now = self.clock()
        if isinstance(result, FpmDecodeError):
            with self._lock:
                self._dropped[result.kind] = self._dropped.get(result.kind, 0) + 1
            self._throttle.warn(
                result.kind,
                "dropped an FPM frame from %s (%s): %s",
                endpoint,
                result.kind,
                result.detail[:200],
            )
            return
        key = result.engine_key
        with self._lock:
            if endpoint not in self._wanted:  # a late message from a removed endpoint
                return
            previous = self._latest.get(key)
            if previous is not None and result.counter_id > previous.counter_id + 1:
                self._counts["missed"] += result.counter_id - previous.counter_id - 1
            self._latest[key] = result
            self._seen[key] = now
            self._origin[key] = endpoint
            self._counts["received"] += 1
            if result.is_idle_heartbeat:
                self._counts["heartbeats"] += 1
            else:
                if len(self._samples) == self._samples.maxlen:
                    self._dropped["sample_overflow"] += 1
                self._samples.append(result)
