"""Requests generated from ServeGen client workload descriptions (Alibaba Model Studio).

ServeGen publishes traffic per client and per 600-second window, not per request: for each
window a mean rate, the CV of the inter-arrival times and a fitted Gamma or Weibull
inter-arrival law (``chunk-<client>-trace.csv``), and every 6 hours the probability mass
functions of prompt and output length (``chunk-<client>-dataset.json``, each PMF a Python dict
literal in a string, read with ``ast.literal_eval``). The folder of one model holds its clients.

A trace argument ``servegen:DIR[,key=value...]`` replays that model's traffic:

- ``clients=61/34`` (or ``chunk-61/chunk-34``): the clients to sum (default: every client in
  ``DIR``);
- ``start=1d``: where in the 14 days to begin (default 0; ``s``/``m``/``h``/``d`` suffixes);
- ``span=1d``: how much trace time to replay (default: to the end);
- ``speedup=24``: compress time by X (one day in an hour: 24); rates grow by X, as
  ``--speedup`` does for any trace;
- ``scale=K``: multiply every window's rate by K; or ``rate=R``: choose K so that the mean
  arrival rate of what is replayed (after ``speedup``) is R requests per second;
- ``seed=N``: the seed of every draw (default 0); the same options give the same requests.

Arrival times count from ``start`` (divided by ``speedup``), so windows where the chosen
clients are idle keep their place in the day.

Each window's request count is its rate x 600 s x K, rounded at random to a whole number
(exact in expectation); the arrivals are that many draws of the fitted law, rescaled to fill
the window (the fitted scale is not in seconds), so burstiness within a window is the fitted
one. Lengths come from the client's PMF of the 6-hour block the window falls in; a client
without a length file (or with an empty PMF, ``{}``, for that block) uses the pooled PMF of
the folder's clients that have one, mixed per request in proportion to their requests in
that block. Each client draws from its own random stream, so choosing a
subset of clients does not change the requests of the others.

A bad row of a ``trace.csv`` names the file, line and field (with ``skip_bad_rows`` it is
counted and that window left idle); a bad length file is always an error, naming the file,
the block and the field.
"""

from __future__ import annotations

import ast
import bisect
import csv
import itertools
import json
import math
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from disagg_planner.predictors.traces.durations import parse_seconds
from disagg_planner.predictors.traces.errors import TraceError

SERVEGEN = "servegen"
SERVEGEN_PREFIX = "servegen:"
WINDOW_S = 600.0
LENGTH_BLOCK_S = 21600.0  # the length files' blocks: 6 hours
DISTRIBUTIONS = ("Gamma", "Weibull")
OPTIONS = ("clients", "start", "span", "speedup", "scale", "rate", "seed")
_TRACE_NAME = re.compile(r"^chunk-(\d+)-trace\.csv$")
_COLUMNS = "window start, rate, cv, distribution, shape, scale"

# Called with (file, line, reason) for a bad row: raises, or counts it and returns.
BadRowHandler = Callable[[Path, int, str], None]


def is_servegen(path: str | Path, trace_format: str | None) -> bool:
    """Whether a trace argument names ServeGen descriptions (``servegen:DIR...``, or
    ``--trace-format servegen``)."""
    return trace_format == SERVEGEN or str(path).startswith(SERVEGEN_PREFIX)


def looks_like_servegen(folder: Path) -> bool:
    """A folder of ``chunk-<client>-trace.csv`` files (to point at ``servegen:`` in errors)."""
    return folder.is_dir() and any(_TRACE_NAME.match(p.name) for p in folder.iterdir())


@dataclass(frozen=True)
class ServeGenOptions:
    folder: Path
    clients: tuple[str, ...] | None = None
    start_s: float = 0.0
    span_s: float | None = None
    speedup: float = 1.0
    scale: float | None = None
    rate: float | None = None
    seed: int = 0


def parse_options(text: str) -> ServeGenOptions:
    """``[servegen:]DIR[,key=value...]`` -> options; TraceError naming the bad option."""
    body = text[len(SERVEGEN_PREFIX) :] if text.startswith(SERVEGEN_PREFIX) else text
    folder_text, *parts = body.split(",")
    if not folder_text.strip():
        raise TraceError(f"trace {text!r}: expected servegen:DIR[,key=value...]")
    values: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in parts)):
        key, sep, value = (s.strip() for s in part.partition("="))
        if not sep:
            raise TraceError(f"trace {text!r}: {part!r} is not key=value")
        if key not in OPTIONS:
            raise TraceError(f"trace {text!r}: unknown option {key!r}; known: {', '.join(OPTIONS)}")
        values[key] = value

    def number(key: str, *, positive: bool) -> float | None:
        if key not in values:
            return None
        try:
            value = float(values[key])
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            bound = "> 0" if positive else ">= 0"
            raise TraceError(f"trace {text!r}: {key}={values[key]!r}: expected a number {bound}")
        return value

    def seconds(key: str) -> float | None:
        if key not in values:
            return None
        try:
            return parse_seconds(values[key])
        except ValueError as exc:
            raise TraceError(f"trace {text!r}: {key}={values[key]!r}: {exc}") from None

    clients = None
    if "clients" in values:
        names = [c.strip() for c in re.split(r"[/+]", values["clients"]) if c.strip()]
        ids = [c.removeprefix("chunk-") for c in names]
        bad = [c for c in ids if not c.isdigit()]
        if not ids or bad:
            raise TraceError(
                f"trace {text!r}: clients={values['clients']!r}: expected client numbers "
                "separated by / (e.g. clients=61/34)"
            )
        clients = tuple(dict.fromkeys(ids))
    seed_text = values.get("seed", "0")
    if not re.fullmatch(r"\d+", seed_text):
        raise TraceError(f"trace {text!r}: seed={seed_text!r}: expected a whole number >= 0")
    if "scale" in values and "rate" in values:
        raise TraceError(f"trace {text!r}: give scale= or rate=, not both")
    span = seconds("span")
    if span == 0:
        raise TraceError(f"trace {text!r}: span={values['span']!r}: expected a duration > 0")
    return ServeGenOptions(
        folder=Path(folder_text.strip()).expanduser(),
        clients=clients,
        start_s=seconds("start") or 0.0,
        span_s=span,
        speedup=number("speedup", positive=True) or 1.0,
        scale=number("scale", positive=False),
        rate=number("rate", positive=True),
        seed=int(seed_text),
    )


@dataclass(frozen=True, slots=True)
class Window:
    start_s: float
    rate: float
    law: str  # "Gamma", "Weibull", or "" when idle
    shape: float


def _field(value: str, name: str, *, positive: bool = False) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        raise ValueError(
            f"{name} = {value!r}: expected a finite number {'> 0' if positive else '>= 0'}"
        )
    return number


def _window(row: list[str]) -> Window:
    """One row of a ``trace.csv``; ValueError naming the field that is wrong."""
    if len(row) != 6:
        raise ValueError(f"{len(row)} column(s): expected 6 ({_COLUMNS})")
    start = _field(row[0], "window start")
    if start % WINDOW_S:
        raise ValueError(f"window start = {row[0]!r}: expected a multiple of {WINDOW_S:g} s")
    rate = _field(row[1], "rate")
    _field(row[2], "cv")
    law = row[3].strip()
    if rate == 0:
        return Window(start, 0.0, "", 0.0)
    if law not in DISTRIBUTIONS:
        raise ValueError(
            f"distribution = {row[3]!r}: expected {' or '.join(DISTRIBUTIONS)} "
            f"in a window with rate {rate:g}"
        )
    shape = _field(row[4], "shape", positive=True)
    _field(row[5], "scale", positive=True)
    return Window(start, rate, law, shape)


def read_windows(path: Path, bad: BadRowHandler) -> dict[float, Window]:
    """A client's windows by start time (bad rows go to ``bad`` and are left out)."""
    windows: dict[float, Window] = {}
    last = -math.inf
    try:
        with path.open(newline="", encoding="utf-8") as stream:
            reader = csv.reader(stream)
            for row in reader:
                if not row or all(not cell.strip() for cell in row):
                    continue
                try:
                    window = _window(row)
                    if window.start_s <= last:
                        raise ValueError(
                            f"window start = {row[0]!r}: expected windows in increasing order "
                            f"(the one before starts at {last:g})"
                        )
                except ValueError as exc:
                    bad(path, reader.line_num, str(exc))
                    continue
                last = window.start_s
                windows[window.start_s] = window
    except OSError as exc:
        raise TraceError(f"cannot read: {exc.strerror or exc}", path=path) from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"cannot read as text: {exc}", path=path) from None
    return windows


@dataclass
class LengthPmf:
    """A token-length probability mass function, sampled by inverse CDF."""

    values: list[int]
    cumulative: list[float]

    def sample(self, rng: random.Random) -> int:
        i = bisect.bisect_right(self.cumulative, rng.random() * self.cumulative[-1])
        return self.values[min(i, len(self.values) - 1)]


def parse_pmf(text: Any, where: str) -> LengthPmf | None:
    """A ``{tokens: probability}`` dict literal in a string (None for ``{}``); ValueError
    saying what is wrong."""
    if not isinstance(text, str):
        raise ValueError(f"{where}: expected a string holding a dict literal, got {text!r:.60}")
    try:
        pmf = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise ValueError(f"{where}: not a Python dict literal: {text[:60]!r}") from None
    if not isinstance(pmf, dict):
        raise ValueError(f"{where}: expected a {{tokens: probability}} dict")
    if not pmf:
        return None
    values: list[int] = []
    cumulative: list[float] = []
    total = 0.0
    for tokens, p in sorted(pmf.items(), key=lambda item: repr(item[0])):
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise ValueError(f"{where}: length {tokens!r}: expected a whole number of tokens")
        if isinstance(p, bool) or not isinstance(p, int | float) or not math.isfinite(p) or p < 0:
            raise ValueError(f"{where}: probability of {tokens} = {p!r}: expected a number >= 0")
        if p > 0:
            total += p
            values.append(tokens)
            cumulative.append(total)
    if total <= 0:
        raise ValueError(f"{where}: every probability is 0")
    return LengthPmf(values, cumulative)


@dataclass
class LengthFile:
    """A client's ``dataset.json``: PMFs per 6-hour block, parsed when first needed (a file
    holds 56 blocks, and literal_eval of all of them takes seconds)."""

    path: Path
    raw: dict[int, Any]
    starts: list[int]
    parsed: dict[int, tuple[LengthPmf, LengthPmf] | None] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> LengthFile:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise TraceError(f"cannot read: {exc.strerror or exc}", path=path) from None
        except UnicodeDecodeError as exc:
            raise TraceError(f"cannot read as text: {exc}", path=path) from None
        except json.JSONDecodeError as exc:
            raise TraceError(f"not valid JSON ({exc.msg})", path=path, line=exc.lineno) from None
        if not isinstance(data, dict) or not data:
            raise TraceError(
                'expected a JSON object keyed by block start in seconds ({"0": {...}, ...})',
                path=path,
            )
        raw: dict[int, Any] = {}
        for key, value in data.items():
            if not key.isdigit():
                raise TraceError(f"key {key!r}: expected a block start in whole seconds", path=path)
            if not isinstance(value, dict):
                raise TraceError(
                    f"key {key!r}: expected an object with input_tokens and output_tokens",
                    path=path,
                )
            raw[int(key)] = value
        return cls(path, raw, sorted(raw))

    def block_of(self, time_s: float) -> int:
        i = bisect.bisect_right(self.starts, time_s) - 1
        if i < 0:
            raise TraceError(
                f"no length distribution for the window at {time_s:g} s (the first block "
                f"starts at {self.starts[0]} s)",
                path=self.path,
            )
        return self.starts[i]

    def pmfs(self, block: int) -> tuple[LengthPmf, LengthPmf] | None:
        """The block's (input, output) PMFs; None where the file gives an empty one (``{}``:
        the client sent nothing then), so the pool stands in."""
        if block not in self.parsed:
            entry = self.raw[block]
            try:
                pair = tuple(
                    parse_pmf(entry.get(name), f"key {str(block)!r}: {name}")
                    for name in ("input_tokens", "output_tokens")
                )
            except ValueError as exc:
                raise TraceError(str(exc), path=self.path) from None
            self.parsed[block] = None if pair[0] is None or pair[1] is None else (pair[0], pair[1])
        return self.parsed[block]


@dataclass
class Client:
    name: str
    trace: Path
    windows: dict[float, Window]
    lengths: LengthFile | None
    arrivals: random.Random
    sizes: random.Random

    def block_requests(self, start: float, end: float) -> float:
        return sum(w.rate for t, w in self.windows.items() if start <= t < end) * WINDOW_S


class ServeGenSource:
    """The requests of one model's ServeGen clients under ``options`` (module doc).

    ``files`` lists what it reads. ``iterate(bad)`` yields ``(arrival in trace seconds,
    input, output)`` in time order; ``bad`` receives bad rows.
    """

    def __init__(self, options: ServeGenOptions, bad: BadRowHandler) -> None:
        self.options = options
        folder = options.folder
        if not folder.is_dir():
            raise TraceError(
                "no such directory: expected a folder of ServeGen chunk-<client>-trace.csv "
                "files (e.g. servegen/m-large)",
                path=folder,
            )
        found = {
            m.group(1): p
            for p in sorted(folder.iterdir())
            if (m := _TRACE_NAME.match(p.name)) and p.is_file()
        }
        if not found:
            raise TraceError("no chunk-<client>-trace.csv files in this folder", path=folder)
        wanted = options.clients or tuple(sorted(found, key=int))
        missing = [c for c in wanted if c not in found]
        if missing:
            raise TraceError(
                f"clients={'/'.join(missing)}: no chunk-<client>-trace.csv for them; this "
                f"folder has {'/'.join(sorted(found, key=int))}",
                path=folder,
            )
        self.clients = [self._client(c, found[c], bad) for c in wanted]
        self.files = [c.trace for c in self.clients] + [
            c.lengths.path for c in self.clients if c.lengths is not None
        ]
        # The pool, for clients without a length file or with an empty block: every client
        # of the folder with a length file. Built when first needed (it reads their files),
        # at once when a chosen client has no length file, so that a folder without any fails
        # before the first request.
        self._found = found
        self._bad = bad
        self._pool: list[Client] | None = None
        self._pool_cache: dict[
            tuple[int, ...], tuple[list[tuple[LengthPmf, LengthPmf]], list[float]]
        ] = {}
        if any(c.lengths is None for c in self.clients):
            self._pool_members()
        last = max((max(c.windows, default=0.0) for c in self.clients), default=0.0) + WINDOW_S
        self.start_s = options.start_s
        self.end_s = last if options.span_s is None else options.start_s + options.span_s
        if self.start_s >= last:
            raise TraceError(
                f"start={self.start_s:g} s is past the trace's end ({last:g} s)", path=folder
            )
        self.scale = self._scale()

    def _client(self, name: str, trace: Path, bad: BadRowHandler) -> Client:
        dataset = trace.with_name(f"chunk-{name}-dataset.json")
        seed = self.options.seed
        return Client(
            name=name,
            trace=trace,
            windows=read_windows(trace, bad),
            lengths=LengthFile.load(dataset) if dataset.is_file() else None,
            arrivals=random.Random(f"servegen:{seed}:{name}:arrivals"),
            sizes=random.Random(f"servegen:{seed}:{name}:lengths"),
        )

    def expected_requests(self) -> float:
        """Requests the replayed span holds at scale 1 (window rates x overlap)."""
        total = 0.0
        for client in self.clients:
            for t, w in client.windows.items():
                overlap = min(t + WINDOW_S, self.end_s) - max(t, self.start_s)
                if overlap > 0:
                    total += w.rate * overlap
        return total

    def _scale(self) -> float:
        if self.options.rate is None:
            return 1.0 if self.options.scale is None else self.options.scale
        expected = self.expected_requests()
        if expected <= 0:
            raise TraceError(
                f"rate={self.options.rate:g}: the chosen clients send no requests between "
                f"{self.start_s:g} s and {self.end_s:g} s",
                path=self.options.folder,
            )
        replayed_s = (self.end_s - self.start_s) / self.options.speedup
        return self.options.rate * replayed_s / expected

    def _pool_members(self) -> list[Client]:
        if self._pool is None:
            chosen = {c.name: c for c in self.clients}
            folder = self.options.folder
            pool = [
                chosen.get(name) or self._client(name, trace, self._bad)
                for name, trace in self._found.items()
                if (folder / f"chunk-{name}-dataset.json").is_file()
            ]
            if not pool:
                raise TraceError(
                    "no client in this folder has a chunk-<client>-dataset.json, so the "
                    "clients without one have no length distribution",
                    path=folder,
                )
            self.files += [c.lengths.path for c in pool if c.lengths and c.name not in chosen]
            self._pool = pool
        return self._pool

    def _pool_at(
        self, window_start: float
    ) -> tuple[list[tuple[LengthPmf, LengthPmf]], list[float]]:
        """The pool members' PMFs for the blocks ``window_start`` falls in, and their weights:
        each member's requests in its block (equal weights if none has any). Members whose
        block is empty are left out."""
        members = [m for m in self._pool_members() if m.lengths is not None]
        blocks = tuple(m.lengths.block_of(window_start) for m in members if m.lengths)
        if blocks not in self._pool_cache:
            pmfs, weights = [], []
            for member, block in zip(members, blocks, strict=True):
                assert member.lengths is not None
                pair = member.lengths.pmfs(block)
                if pair is not None:
                    pmfs.append(pair)
                    weights.append(member.block_requests(block, block + LENGTH_BLOCK_S))
            if not pmfs:
                raise TraceError(
                    f"no client has a length distribution for the window at {window_start:g} s",
                    path=self.options.folder,
                )
            if sum(weights) <= 0:
                weights = [1.0] * len(pmfs)
            self._pool_cache[blocks] = (pmfs, weights)
        return self._pool_cache[blocks]

    def _window_requests(self, client: Client, window: Window) -> list[tuple[float, int, int]]:
        rng = client.arrivals
        mean = window.rate * WINDOW_S * self.scale
        count = math.floor(mean) + (1 if rng.random() < mean - math.floor(mean) else 0)
        if count == 0:
            return []
        # count + 1 gaps fill the window: the arrivals keep the fitted law's burstiness and
        # their number is exact.
        if window.law == "Gamma":
            gaps = [rng.gammavariate(window.shape, 1.0) for _ in range(count + 1)]
        else:
            gaps = [rng.weibullvariate(1.0, window.shape) for _ in range(count + 1)]
        total = math.fsum(gaps)
        if not total > 0:  # every draw underflowed: spread evenly
            gaps, total = [1.0] * (count + 1), float(count + 1)
        sizes = client.sizes
        own = None
        if client.lengths is not None:
            own = client.lengths.pmfs(client.lengths.block_of(window.start_s))
        weights = None
        if own is not None:
            pmfs = [own]
        else:
            # The pooled PMF is a mixture: each request draws its member, then its lengths.
            pmfs, weights = self._pool_at(window.start_s)
        out = []
        for t in itertools.accumulate(gaps[:count]):
            at = window.start_s + WINDOW_S * t / total
            isl, osl = pmfs[0] if weights is None else sizes.choices(pmfs, weights=weights)[0]
            out.append((at, isl.sample(sizes), osl.sample(sizes)))
        return out

    def iterate(self) -> Iterator[tuple[float, int, int]]:
        first = math.floor(self.start_s / WINDOW_S) * WINDOW_S
        for start in itertools.count(first, WINDOW_S):
            if start >= self.end_s:
                return
            batch: list[tuple[float, int, int]] = []
            for client in self.clients:
                window = client.windows.get(start)
                if window is not None and window.rate > 0:
                    batch.extend(self._window_requests(client, window))
            batch.sort()
            for at, isl, osl in batch:
                if self.start_s <= at < self.end_s:
                    yield (at - self.start_s) / self.options.speedup, isl, osl
