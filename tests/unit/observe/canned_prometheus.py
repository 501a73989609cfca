"""A stand-in for Prometheus' HTTP API that records each request and returns canned replies.

For what the observer sends (headers, parameters) and how it treats what comes back
(HTTP errors, slow answers, bodies that are not a query result). The PromQL itself is
tested against a real Prometheus in ``tests/integration/prometheus``.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

TLS_DIR = Path(__file__).parent / "tls"


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes = b""
    delay_s: float = 0.0
    content_type: str = "application/json"


@dataclass(frozen=True)
class Recorded:
    path: str
    params: dict[str, list[str]]
    headers: dict[str, str]

    def param(self, name: str) -> str:
        (value,) = self.params[name]
        return value


def vector_reply(
    parts: Mapping[str, float | str],
    *,
    buckets: Mapping[str, Mapping[str, float]] | None = None,
    at_s: float = 1_700_000_000.0,
) -> Reply:
    """A successful instant-vector reply with one sample per ``planner_part``."""
    result: list[dict[str, Any]] = [
        {"metric": {"planner_part": name}, "value": [at_s, str(value)]}
        for name, value in parts.items()
    ]
    for key, per_le in (buckets or {}).items():
        result += [
            {"metric": {"planner_part": f"{key}_bucket", "le": le}, "value": [at_s, str(v)]}
            for le, v in per_le.items()
        ]
    body = {"status": "success", "data": {"resultType": "vector", "result": result}}
    return Reply(body=json.dumps(body).encode())


def matrix_reply(series: Mapping[str, Sequence[tuple[float, float]]]) -> Reply:
    """A successful range-vector reply: per series (its ``pod`` label), (time, value) pairs."""
    result = [
        {
            "metric": {"__name__": "dynamo_frontend_requests_started_total", "pod": pod},
            "values": [[t, str(v)] for t, v in samples],
        }
        for pod, samples in series.items()
    ]
    body = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    return Reply(body=json.dumps(body).encode())


def covering_samples(time_s: float) -> Reply:
    """One counter series scraped every 15 s for the hour before ``time_s``: any window
    ending then is covered."""
    return matrix_reply({"a": [(time_s - 15.0 * i, 1000.0 - i) for i in range(240, -1, -1)]})


@dataclass
class CannedPrometheus:
    """Serves ``reply`` to every traffic query on a loopback port (HTTPS with ``tls=True``),
    and ``samples_reply`` to every query of raw samples (a range selector; by default a
    series that covers the window)."""

    tls: bool = False
    reply: Reply = field(default_factory=lambda: vector_reply({}))
    samples_reply: Reply | None = None
    requests: list[Recorded] = field(default_factory=list)

    def __post_init__(self) -> None:
        canned = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                recorded = Recorded(url.path, parse_qs(url.query), dict(self.headers.items()))
                canned.requests.append(recorded)
                reply = canned.reply
                if "planner_part" not in recorded.param("query"):
                    reply = canned.samples_reply or covering_samples(float(recorded.param("time")))
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", reply.content_type)
                    self.send_header("Content-Length", str(len(reply.body)))
                    self.end_headers()
                    self.wfile.write(reply.body)
                except OSError:
                    pass  # the client gave up (timeout tests)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        if self.tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(TLS_DIR / "cert.pem", TLS_DIR / "key.pem")
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        port = self._server.server_address[1]
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
