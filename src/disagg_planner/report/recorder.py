"""Per-tick snapshots of what the planner saw and decided, and the reports made from them.

The same recorder serves the live controller and replay (one report at the end). Times are
the caller's clock (wall or simulated), never read here.

Bounded by time and bytes, for an operator that runs for months: the ticks are kept for
``report_window_hours`` only, each as its compact JSON, packed by blocks of
:data:`BLOCK_TICKS` into one zlib blob (about a hundred bytes a tick instead of a 2 kB
object); a report is rendered on demand (:meth:`DiagnosticsRecorder.render_html`: the
``/report/<namespace>/<name>`` endpoint of the metrics port and ``planner report --live``)
or on its schedule (every ``report_interval_hours``, the first one at a phase of its own per
deployment, so that policies created together do not render together). A scheduled report
replaces nothing but adds a file; the oldest are deleted so that a deployment keeps at most
``report_keep_files`` and the whole report folder at most ``report_max_bytes``. Nothing is
rendered when a loop stops. A live process renders in a child process
(:mod:`disagg_planner.report.child`), so that no render's modules or peak heap stay in it.
"""

from __future__ import annotations

import gzip
import json
import logging
import threading
import zlib
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from disagg_planner.core.schedule import stagger_fraction
from disagg_planner.report.child import render_in_child
from disagg_planner.report.snapshot import TickSnapshot

log = logging.getLogger(__name__)

MAX_SNAPSHOTS = 50_000
# Ticks packed into one compressed block (the window drops whole blocks).
BLOCK_TICKS = 256
REPORT_SUFFIXES = (".html", ".log.jsonl.gz")


class TickWindow:
    """The ticks of the last ``window_s`` (None: no limit), at most ``max_ticks``, compact.

    Each tick is its JSON; every :data:`BLOCK_TICKS` ticks are compressed into one blob, and
    whole blocks leave once their last tick is older than the window (so up to one block
    more than the window is kept).
    """

    def __init__(self, *, window_s: float | None, max_ticks: int = MAX_SNAPSHOTS) -> None:
        self.window_s = window_s
        self.max_ticks = max_ticks
        self._blocks: deque[tuple[float, int, bytes]] = deque()  # last t, ticks, blob
        self._open: list[bytes] = []
        self._sealed_ticks = 0
        self._last_t: float | None = None

    def __len__(self) -> int:
        return self._sealed_ticks + len(self._open)

    @property
    def last_t(self) -> float | None:
        return self._last_t

    @property
    def nbytes(self) -> int:
        """Bytes held by the ticks (the blobs and the open block's texts)."""
        return sum(len(blob) for _, _, blob in self._blocks) + sum(map(len, self._open))

    def append(self, snapshot: TickSnapshot) -> None:
        self._open.append(json.dumps(snapshot.to_json(), separators=(",", ":")).encode())
        self._last_t = snapshot.t_s
        if len(self._open) >= BLOCK_TICKS:
            blob = zlib.compress(b"\n".join(self._open), 6)
            self._blocks.append((snapshot.t_s, len(self._open), blob))
            self._sealed_ticks += len(self._open)
            self._open = []
        self._trim(snapshot.t_s)

    def _trim(self, now_s: float) -> None:
        while self._blocks:
            last_t, count, _ = self._blocks[0]
            too_old = self.window_s is not None and last_t < now_s - self.window_s
            if not (too_old or len(self) - count >= self.max_ticks):
                return
            self._blocks.popleft()
            self._sealed_ticks -= count

    def _lines(self) -> Iterator[bytes]:
        # The lists are copied now (the caller may hold a lock), decompressed when iterated.
        blobs = [blob for _, _, blob in self._blocks]
        return _decoded(blobs, list(self._open))

    def snapshots(self) -> list[TickSnapshot]:
        """The ticks kept, oldest first."""
        return [TickSnapshot.from_json(json.loads(line)) for line in self._lines()]

    def json_lines(self) -> Iterator[bytes]:
        """Each tick's JSON (what the gzip log holds)."""
        return self._lines()


def _decoded(blobs: list[bytes], open_lines: list[bytes]) -> Iterator[bytes]:
    for blob in blobs:
        yield from zlib.decompress(blob).split(b"\n")
    yield from open_lines


def prune_reports(
    directory: Path, *, keep: int | None, root: Path | None, max_bytes: int | None
) -> list[Path]:
    """Delete the oldest reports: ``directory`` keeps its newest ``keep`` (a report is its
    HTML and its log), and every report under ``root`` together at most ``max_bytes``.
    The newest report of ``directory`` is never deleted. Returns what was deleted."""
    deleted: list[Path] = []

    def reports_in(folder: Path, *, recursive: bool) -> list[Path]:
        files = folder.rglob("*") if recursive else folder.glob("*")
        found = [p for p in files if p.is_file() and p.name.endswith(REPORT_SUFFIXES)]
        return sorted(found, key=lambda p: (p.stat().st_mtime_ns, p.name))

    def base(path: Path) -> Path:
        for suffix in REPORT_SUFFIXES:
            if path.name.endswith(suffix):
                return path.with_name(path.name.removesuffix(suffix))
        return path

    mine = reports_in(directory, recursive=False)
    newest = base(mine[-1]) if mine else None
    if keep is not None:
        bases = list(dict.fromkeys(base(p) for p in reversed(mine)))  # newest first
        old = set(bases[keep:])
        for path in mine:
            if base(path) in old:
                path.unlink(missing_ok=True)
                deleted.append(path)
    if root is not None and max_bytes is not None:
        everything = [p for p in reports_in(root, recursive=True) if p not in deleted]
        sizes = {p: p.stat().st_size for p in everything}
        total = sum(sizes.values())
        for path in everything:
            if total <= max_bytes:
                break
            if base(path) == newest:
                continue
            path.unlink(missing_ok=True)
            deleted.append(path)
            total -= sizes[path]
    return deleted


class DiagnosticsRecorder:
    """Keeps the ticks of a rolling window; renders reports on demand or on its schedule.

    ``window_hours`` None keeps up to :data:`MAX_SNAPSHOTS` ticks (replay). ``keep_files``,
    ``max_bytes`` and ``disk_root`` bound the scheduled reports on disk (module doc);
    ``stagger_key`` (the deployment) sets the phase of the schedule. ``render_in_child``
    renders the reports without sections in a child process (:mod:`disagg_planner.report.child`).
    """

    def __init__(
        self,
        *,
        output_dir: str | Path,
        report_interval_hours: float | None = None,
        filename: str | None = None,
        write_gzip_log: bool = True,
        ttft_slo_ms: float | None = None,
        itl_slo_ms: float | None = None,
        title: str = "Planner diagnostics",
        window_hours: float | None = None,
        keep_files: int | None = None,
        max_bytes: int | None = None,
        disk_root: str | Path | None = None,
        stagger_key: str | None = None,
        render_in_child: bool = False,
    ) -> None:
        self.output_dir = Path(output_dir)
        self.report_interval_s = (
            report_interval_hours * 3600.0 if report_interval_hours is not None else None
        )
        self.filename = filename
        self.write_gzip_log = write_gzip_log
        self.ttft_slo_ms = ttft_slo_ms
        self.itl_slo_ms = itl_slo_ms
        self.title = title
        self.keep_files = keep_files
        self.max_bytes = max_bytes
        self.disk_root = Path(disk_root) if disk_root is not None else None
        self.ticks = TickWindow(window_s=window_hours * 3600.0 if window_hours else None)
        # Where in its interval the first report falls: half to one interval after the
        # first tick, by the deployment (without a key: one interval).
        self._phase = 1.0 if stagger_key is None else 0.5 + stagger_fraction(stagger_key) / 2
        self._next_report_s: float | None = None
        self._lock = threading.Lock()  # ticks arrive from the loop, renders from HTTP too
        # A live process renders in a child (report/child.py: the render's modules and peak
        # heap would otherwise stay in the operator for good); replay renders in place.
        self.render_in_child = render_in_child

    def __len__(self) -> int:
        return len(self.ticks)

    @property
    def snapshots(self) -> list[TickSnapshot]:
        """The ticks kept, oldest first (decoded; for reports and tests)."""
        with self._lock:
            return self.ticks.snapshots()

    def record(self, snapshot: TickSnapshot) -> Path | None:
        """Store a snapshot; write a scheduled report when one is due (returns its path)."""
        with self._lock:
            self.ticks.append(snapshot)
        interval = self.report_interval_s
        if interval is None:
            return None
        if self._next_report_s is None:
            self._next_report_s = snapshot.t_s + interval * self._phase
        if snapshot.t_s >= self._next_report_s:
            self._next_report_s = snapshot.t_s + interval
            return self.write_report()
        return None

    def render_html(self, **sections: Any) -> str | None:
        """The HTML report of the ticks in the window (None before any); ``sections`` are
        what the caller adds to it (keyword arguments of
        :func:`disagg_planner.report.html.render_report`: replay's score, latency, load)."""
        return self._render(None, sections)

    def _render(self, out: Path | None, sections: dict[str, Any]) -> str | None:
        """The report's HTML, or None once written to ``out`` (None too with no ticks)."""
        if self.render_in_child and not sections:
            if len(self.ticks) == 0:
                return None
            with self._lock:
                lines = self.ticks.json_lines()  # the window now, decoded while streamed
            return render_in_child(
                lines,
                title=self.title,
                ttft_slo_ms=self.ttft_slo_ms,
                itl_slo_ms=self.itl_slo_ms,
                out=out,
            )
        # imported here, not at the top: a live process that renders in a child never loads
        # plotly and the report code (no import circle: html.py does not import this module)
        from disagg_planner.report.html import render_report

        snapshots = self.snapshots
        if not snapshots:
            return None
        html = render_report(
            snapshots,
            title=self.title,
            ttft_slo_ms=self.ttft_slo_ms,
            itl_slo_ms=self.itl_slo_ms,
            **sections,
        )
        if out is None:
            return html
        out.write_text(html, encoding="utf-8")
        return None

    def write_report(self, **sections: Any) -> Path | None:
        """Write the HTML report (and the gzip log) of the ticks in the window, then delete
        the oldest reports beyond the limits."""
        if len(self.ticks) == 0:
            return None
        self.output_dir.mkdir(parents=True, exist_ok=True)
        last_t = self.ticks.last_t or 0.0
        base = (self.filename or f"planner-report-{int(last_t)}s").removesuffix(".html")
        path = self.output_dir / f"{base}.html"
        self._render(path, sections)
        if self.write_gzip_log:
            with self._lock:
                lines = self.ticks.json_lines()
            with gzip.open(self.output_dir / f"{base}.log.jsonl.gz", "wb") as handle:
                for line in lines:  # a line at a time: the window is never held decoded
                    handle.write(line + b"\n")
        deleted = prune_reports(
            self.output_dir, keep=self.keep_files, root=self.disk_root, max_bytes=self.max_bytes
        )
        log.info(
            "wrote report %s (%d ticks)%s",
            path,
            len(self.ticks),
            f"; deleted {len(deleted)} older file(s)" if deleted else "",
        )
        return path
