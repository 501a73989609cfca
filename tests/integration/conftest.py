"""Shared fixtures for integration tests: real servers on loopback ports.

``prometheus_factory`` (per test) and ``module_prometheus_factory`` (per module) start the
Debian ``prometheus`` binary with a scrape config over the given targets, wait until it is
ready and every target is up, and stop it at teardown. The returned
:class:`PrometheusServer` can be stopped and restarted mid-test (same port, same data), its
targets changed, and queried directly.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

PROMETHEUS_BINARY = shutil.which("prometheus") or "/usr/bin/prometheus"


# Under pytest-xdist (the default run) each worker hands out ports from its own block below
# the kernel's ephemeral range (Linux: 32768 and up), which the kernel never gives to a bind to
# port 0 or to an outgoing connection. A port one worker took and closed, for a server to bind
# a moment later, is then never handed to another worker (or to the kernel's own choice) in
# between: parallel workers cannot collide on a port.
_WORKER_PORTS_START = 10_000
_WORKER_PORTS_END = 32_000
_next_in_block = 0


def _worker_block() -> range | None:
    """This xdist worker's ports (``PYTEST_XDIST_WORKER`` is ``gw0``, ``gw1``, ...); None
    outside xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return None
    index = int(worker[2:])
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), index + 1)
    size = (_WORKER_PORTS_END - _WORKER_PORTS_START) // count
    start = _WORKER_PORTS_START + index * size
    return range(start, start + size)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (under xdist, from this worker's
    own block, taken in turn)."""
    global _next_in_block
    block = _worker_block()
    if block is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
            return port
    for _ in range(len(block)):
        candidate = block[_next_in_block % len(block)]
        _next_in_block += 1
        if _bindable(candidate):
            return candidate
    raise RuntimeError(f"no free port in this worker's block {block.start}-{block.stop - 1}")


def poll(
    probe: Callable[[], T | None],
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 0.1,
) -> T:
    """Call ``probe`` until it returns something other than None; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = probe()
        if result is not None:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


class PrometheusServer:
    """One ``prometheus`` process scraping ``targets`` (``host:port`` of /metrics pages).

    All targets are in one job, ``job_name``; each sample gets ``instance="<target>"``.
    The TSDB lives in ``workdir/data`` and survives :meth:`stop`/:meth:`start`.
    """

    def __init__(
        self,
        *,
        targets: Sequence[str],
        workdir: Path,
        scrape_interval_s: float = 1.0,
        job_name: str = "targets",
        binary: str = PROMETHEUS_BINARY,
    ) -> None:
        if not Path(binary).is_file():
            raise FileNotFoundError(
                f"prometheus binary not found at {binary}; install the Debian package "
                "'prometheus' (.ci/run does)"
            )
        self.binary = binary
        self.targets = list(targets)
        self.workdir = workdir
        self.scrape_interval_s = scrape_interval_s
        self.job_name = job_name
        self.port = free_port()
        self.config_path = workdir / "prometheus.yml"
        self.data_dir = workdir / "data"
        self.log_path = workdir / "prometheus.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._write_config()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    # --- lifecycle --------------------------------------------------------------------

    def start(self, *, wait_for_targets: bool = True, timeout_s: float = 20.0) -> None:
        """Start the process (no-op if running), wait until ready and targets are up."""
        if self.running:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={self.config_path}",
                    f"--storage.tsdb.path={self.data_dir}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--storage.tsdb.retention.time=1h",
                    "--web.enable-lifecycle",
                    "--log.level=info",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.wait_ready(timeout_s=timeout_s)
        if wait_for_targets:
            self.wait_targets_up(timeout_s=timeout_s)

    def stop(self, *, timeout_s: float = 10.0) -> None:
        """Stop the process (SIGTERM, then SIGKILL after ``timeout_s``); no-op if stopped."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout_s)

    def restart(self, *, wait_for_targets: bool = True, timeout_s: float = 20.0) -> None:
        """Stop and start again on the same port with the same data."""
        self.stop()
        self.start(wait_for_targets=wait_for_targets, timeout_s=timeout_s)

    def set_targets(self, targets: Sequence[str], *, timeout_s: float = 10.0) -> None:
        """Replace the scraped targets (config reload) and wait until they are up."""
        self.targets = list(targets)
        self._write_config()
        if self.running:
            request = urllib.request.Request(f"{self.url}/-/reload", method="POST")
            with urllib.request.urlopen(request, timeout=5) as response:
                response.read()
            self.wait_targets_up(timeout_s=timeout_s)

    # --- waiting ----------------------------------------------------------------------

    def wait_ready(self, *, timeout_s: float = 20.0) -> None:
        def ready() -> bool | None:
            if not self.running:
                raise RuntimeError(f"prometheus exited during startup:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    return True if response.status == 200 else None
            except (OSError, urllib.error.URLError):
                return None

        try:
            poll(ready, timeout_s=timeout_s, what=f"prometheus ready at {self.url}")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.log_tail()}") from None

    def wait_targets_up(self, *, timeout_s: float = 20.0) -> None:
        """Wait until every configured target has been scraped successfully."""

        def all_up() -> bool | None:
            active = self.api("/api/v1/targets", {"state": "active"})["activeTargets"]
            health = {t["labels"].get("instance"): t["health"] for t in active}
            return True if all(health.get(t) == "up" for t in self.targets) else None

        poll(all_up, timeout_s=timeout_s, what=f"targets {self.targets} up", interval_s=0.2)

    # --- querying ---------------------------------------------------------------------

    def api(self, path: str, params: dict[str, str] | None = None) -> Any:
        """GET an API path and return its ``data``; raise on an error response."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=5) as response:
            body = json.load(response)
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus {path} failed: {body}")
        return body["data"]

    def query(self, expr: str, *, at_s: float | None = None) -> list[dict[str, Any]]:
        """Evaluate ``expr`` (instant query) and return the raw ``result`` list."""
        params = {"query": expr}
        if at_s is not None:
            params["time"] = f"{at_s:.3f}"
        result: list[dict[str, Any]] = self.api("/api/v1/query", params)["result"]
        return result

    def samples(self, selector: str, *, lookback_s: float = 3600.0) -> list[tuple[float, float]]:
        """Raw samples ``(time_s, value)`` of the single series matching ``selector``."""
        result = self.query(f"{selector}[{int(lookback_s)}s]")
        if not result:
            return []
        if len(result) > 1:
            raise ValueError(f"{selector} matches {len(result)} series, expected one")
        return [(float(t), float(v)) for t, v in result[0]["values"]]

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return "(no prometheus log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def _write_config(self) -> None:
        interval = f"{max(1, round(self.scrape_interval_s * 1000))}ms"
        config = {
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "evaluation_interval": interval,
            },
            "scrape_configs": [
                {"job_name": self.job_name, "static_configs": [{"targets": self.targets}]}
            ],
        }
        # JSON is YAML; no YAML writer needed.
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(config, indent=2))
        os.replace(tmp, self.config_path)


PrometheusFactory = Callable[..., PrometheusServer]


def _prometheus_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusFactory]:
    servers: list[PrometheusServer] = []

    def start(
        targets: Sequence[str],
        *,
        scrape_interval_s: float = 1.0,
        wait_for_targets: bool = True,
    ) -> PrometheusServer:
        server = PrometheusServer(
            targets=targets,
            workdir=tmp_path_factory.mktemp("prometheus"),
            scrape_interval_s=scrape_interval_s,
        )
        servers.append(server)
        server.start(wait_for_targets=wait_for_targets)
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def prometheus_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusFactory]:
    """``start(targets, *, scrape_interval_s=1.0, wait_for_targets=True)`` -> a running server,
    stopped when the test ends."""
    yield from _prometheus_factory(tmp_path_factory)


@pytest.fixture(scope="module")
def module_prometheus_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PrometheusFactory]:
    """As ``prometheus_factory``, but the servers live until the module's tests are done."""
    yield from _prometheus_factory(tmp_path_factory)
