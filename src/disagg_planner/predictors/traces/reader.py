"""Stream the requests of a trace given as a file, a glob or a directory (``.gz`` accepted).

Files of a glob or directory are read in name order as one trace, and must all be of one
format. A directory contributes its ``*.jsonl``, ``*.csv`` (and ``.gz``) files; a name
present both compressed and uncompressed is an error (the trace would count twice).

Arrival times are made relative to the first request: for the time-sorted formats (Mooncake,
Azure, BurstGPT) that is the first row, and a later row stamped before it is a bad row. Dynamo
traces are written as requests *end*, so their arrivals are unordered: a first streaming pass
finds the earliest one. Requests come out in file order; the reader never holds more than one
row, so traces larger than memory are fine.

A bad row raises :class:`TraceError` naming the file and line, or, with
``skip_bad_rows=True``, is counted in ``bad_rows`` (the first few messages are kept in
``bad_examples`` and a warning is logged at the end).

A trace argument ``servegen:DIR[,key=value...]`` is not a file of requests but ServeGen's
per-window client descriptions: the requests are generated from them (``servegen.py``) and
come out through the same iterator, counters and errors; their times count from the
``start=`` of the span, not from its first request (idle windows there are part of the load).
"""

from __future__ import annotations

import glob
import gzip
import io
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from disagg_planner.predictors.traces.errors import TraceError
from disagg_planner.predictors.traces.formats import FORMATS, BadRow, Row, detect_format, iter_rows
from disagg_planner.predictors.traces.records import TraceRequest
from disagg_planner.predictors.traces.servegen import (
    SERVEGEN,
    SERVEGEN_PREFIX,
    ServeGenSource,
    is_servegen,
    looks_like_servegen,
    parse_options,
)

log = logging.getLogger(__name__)

_TRACE_SUFFIXES = (".jsonl", ".csv", ".jsonl.gz", ".csv.gz")
_GLOB_CHARS = set("*?[")
_KEPT_EXAMPLES = 5


def resolve_trace_files(path: str | Path) -> list[Path]:
    """The files a trace argument names, in reading order; TraceError if there are none."""
    text = str(path)
    candidate = Path(text).expanduser()
    if candidate.is_dir():
        files = sorted(
            p
            for p in candidate.iterdir()
            if p.is_file() and not p.name.startswith(".") and p.name.endswith(_TRACE_SUFFIXES)
        )
        if not files:
            raise TraceError(
                f"no trace files in this directory (expected {', '.join(_TRACE_SUFFIXES)})",
                path=candidate,
            )
    elif candidate.is_file():
        return [candidate]
    elif _GLOB_CHARS & set(text):
        files = sorted(Path(p) for p in glob.glob(str(candidate)) if Path(p).is_file())
        if not files:
            raise TraceError("no file matches this pattern", path=text)
    else:
        raise TraceError("no such file or directory", path=text)
    names = {str(p) for p in files}
    for p in files:
        if str(p).endswith(".gz") and str(p)[:-3] in names:
            raise TraceError(
                f"both {p.name} and {p.name[:-3]} are present; keep one copy", path=p.parent
            )
    return files


def open_text(path: Path) -> TextIO:
    """Open a trace file as text, gunzipping when it starts with the gzip magic bytes."""
    try:
        with path.open("rb") as raw:
            magic = raw.read(2)
        if magic == b"\x1f\x8b":
            return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
        return path.open("r", encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise TraceError(f"cannot open: {exc.strerror or exc}", path=path) from None


def _first_line(path: Path) -> tuple[int, str] | None:
    with open_text(path) as stream:
        try:
            for number, line in enumerate(stream, start=1):
                if line.strip():
                    return number, line
        except (UnicodeDecodeError, OSError, EOFError) as exc:
            raise TraceError(f"cannot read as text: {exc}", path=path) from None
    return None


def detect_trace_format(files: list[Path]) -> str:
    """The one format of all ``files``; TraceError if unknown or mixed."""
    found: dict[str, Path] = {}
    for path in files:
        first = _first_line(path)
        if first is None:
            continue
        number, line = first
        fmt = detect_format(line)
        if fmt is None:
            raise TraceError(
                "cannot tell the trace format from this line; expected Mooncake or Dynamo "
                "request trace v1 JSON lines, or an Azure (TIMESTAMP,ContextTokens,"
                "GeneratedTokens) or BurstGPT (Timestamp,...,Request tokens,Response tokens) "
                "CSV header; or pass the format explicitly",
                path=path,
                line=number,
            )
        found.setdefault(fmt, path)
    if not found:
        raise TraceError("the trace is empty", path=files[0])
    if len(found) > 1:
        listing = ", ".join(f"{fmt} ({p.name})" for fmt, p in found.items())
        raise TraceError(f"files of different formats in one trace: {listing}")
    return next(iter(found))


class TraceReader(Iterator[TraceRequest]):
    """Iterator over a trace's requests; see the module docstring.

    ``files``, ``format`` are known at construction (missing files and unknown formats fail
    there, not on the first ``next``). ``requests`` and ``bad_rows`` count as it streams.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        trace_format: str | None = None,
        skip_bad_rows: bool = False,
    ) -> None:
        if trace_format is not None and trace_format not in FORMATS:
            raise TraceError(
                f"trace format {trace_format!r} is not known; expected one of {', '.join(FORMATS)}"
            )
        self.skip_bad_rows = skip_bad_rows
        self.requests = 0
        self.bad_rows = 0
        self.bad_examples: list[str] = []
        self._servegen: ServeGenSource | None = None
        if is_servegen(path, trace_format):
            # Generated from per-window descriptions (servegen.py), not read row by row.
            self._servegen = ServeGenSource(parse_options(str(path)), self._bad)
            self.files = self._servegen.files
            self.format = SERVEGEN
        else:
            if looks_like_servegen(Path(str(path)).expanduser()):
                raise TraceError(
                    "a folder of ServeGen client descriptions (chunk-<client>-trace.csv), not "
                    f"a request trace: pass {SERVEGEN_PREFIX}{path}[,clients=...,start=...,"
                    "span=...,speedup=...,rate=...]",
                    path=path,
                )
            self.files = resolve_trace_files(path)
            self.format = trace_format or detect_trace_format(self.files)
        self._rows = self._generate()

    def __next__(self) -> TraceRequest:
        return next(self._rows)

    def _rows_of(self, path: Path) -> Iterator[tuple[int, Row | BadRow | None]]:
        with open_text(path) as stream:
            try:
                yield from iter_rows(stream, self.format)
            except (UnicodeDecodeError, OSError, EOFError) as exc:
                raise TraceError(f"cannot read: {exc}", path=path) from None

    def _bad(self, path: Path, line: int, reason: str) -> None:
        if not self.skip_bad_rows:
            raise TraceError(reason, path=path, line=line)
        self.bad_rows += 1
        if len(self.bad_examples) < _KEPT_EXAMPLES:
            self.bad_examples.append(f"{path}:{line}: {reason}")

    def _earliest(self) -> float | None:
        """First pass for unordered formats: the earliest arrival, ignoring bad rows."""
        earliest = math.inf
        for path in self.files:
            for _, row in self._rows_of(path):
                if isinstance(row, Row) and row.time_s < earliest:
                    earliest = row.time_s
        return earliest if math.isfinite(earliest) else None

    def _all_rows(self) -> Iterator[tuple[Path, int, Row | BadRow | None]]:
        if self._servegen is not None:
            folder = self._servegen.options.folder
            for at, isl, osl in self._servegen.iterate():
                yield folder, 0, Row(time_s=at, input_length=isl, output_length=osl)
            return
        for path in self.files:
            for line, row in self._rows_of(path):
                yield path, line, row

    def _generate(self) -> Iterator[TraceRequest]:
        origin: float | None = None
        if self.format == "dynamo":
            origin = self._earliest()
        elif self._servegen is not None:
            # Generated times already count from start=: idle windows there are traffic too.
            origin = 0.0
        for path, line, row in self._all_rows():
            if row is None:
                continue
            if isinstance(row, BadRow):
                self._bad(path, line, str(row))
                continue
            if origin is None:
                origin = row.time_s
            arrival = row.time_s - origin
            if arrival < 0:
                self._bad(
                    path,
                    line,
                    f"arrival {arrival:.3f} s before the first request: expected rows "
                    "sorted by time",
                )
                continue
            self.requests += 1
            yield TraceRequest(
                arrival_s=arrival,
                input_length=row.input_length,
                output_length=row.output_length,
                hash_ids=row.hash_ids,
            )
        if self.bad_rows:
            log.warning(
                "trace %s: skipped %d bad row(s), first: %s",
                self.files[0] if len(self.files) == 1 else f"({len(self.files)} files)",
                self.bad_rows,
                self.bad_examples[0],
            )


def read_trace(
    path: str | Path, *, trace_format: str | None = None, skip_bad_rows: bool = False
) -> TraceReader:
    """Stream the requests of the trace at ``path`` (file, glob or directory).

    ``trace_format`` is one of ``mooncake``, ``azure``, ``burstgpt``, ``dynamo``, or None to
    detect it from each file's first line; ``servegen:DIR[,key=value...]`` (or
    ``trace_format="servegen"``) generates requests from ServeGen client descriptions
    (``servegen.py``). The returned iterator also reports ``format``,
    ``files``, ``requests`` and ``bad_rows``.
    """
    return TraceReader(path, trace_format=trace_format, skip_bad_rows=skip_bad_rows)
