"""Row parsers, one per trace format, and format detection.

Each parser turns one row into ``Row(time_s, input_length, output_length, hash_ids)`` where
``time_s`` is in seconds on the format's own clock (the reader subtracts the first request's
time), or returns None for a row that is valid but not a request (Dynamo's other events).
A malformed row raises :class:`BadRow` with what was wrong and what was expected.

Formats:

- ``mooncake``: JSON lines ``{"timestamp": ms since trace start, "input_length": tokens,
  "output_length": tokens, "hash_ids": [ints, one per 512-token block]}``.
- ``azure``: Azure LLM inference CSV, 2023 and 2024: ``TIMESTAMP,ContextTokens,GeneratedTokens``;
  2023 stamps have 7 fractional digits and no zone, 2024 stamps 6 digits and ``+00:00``.
  A stamp without a zone is read as UTC (only differences matter).
- ``burstgpt``: BurstGPT CSV: ``Timestamp`` (s since 0:00 of the first day), ``Request tokens``,
  ``Response tokens`` (other columns ignored). Failed requests (0 response tokens) are kept:
  they arrived and were prefilled.
- ``dynamo``: Dynamo request trace v1 JSON lines (``"schema": "dynamo.request.trace.v1"``); only
  ``event_type == "request_end"`` rows are requests. Arrival: ``request.request_received_ms``,
  else ``event_time_unix_ms`` (the end, an approximation); input:
  ``request.replay.input_length``, else ``request.input_tokens``; output:
  ``request.output_tokens``; hashes: ``request.replay.input_sequence_hashes``.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date
from functools import lru_cache
from typing import Any, TextIO

# ``servegen`` is generated from per-window client descriptions (servegen.py), not parsed
# row by row here.
FORMATS: tuple[str, ...] = ("mooncake", "azure", "burstgpt", "dynamo", "servegen")
DYNAMO_SCHEMA = "dynamo.request.trace.v1"

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")


class BadRow(ValueError):
    """One row cannot be read; the message says which field and what was expected."""


@dataclass(frozen=True, slots=True)
class Row:
    """One parsed request before its time is made relative to the trace start."""

    time_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] | None = None


# --- field helpers ----------------------------------------------------------------------------


def _tokens(value: Any, field: str) -> int:
    """A token count: a whole number >= 0 (``"12"``, ``12`` and ``12.0`` are accepted)."""
    if isinstance(value, bool):
        raise BadRow(f"{field} = {value!r}: expected a whole number of tokens >= 0")
    if isinstance(value, int):
        number: float = value
    elif isinstance(value, float):
        number = value
    elif isinstance(value, str):
        text = value.strip()
        try:
            number = int(text) if text.isdigit() else float(text)
        except ValueError:
            raise BadRow(f"{field} = {value!r}: expected a whole number of tokens >= 0") from None
    else:
        raise BadRow(f"{field} = {value!r}: expected a whole number of tokens >= 0")
    if not (math.isfinite(number) and number >= 0 and number == int(number)):
        raise BadRow(f"{field} = {value!r}: expected a whole number of tokens >= 0")
    return int(number)


def _number(value: Any, field: str, unit: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise BadRow(f"{field} = {value!r}: expected a number ({unit})")
    try:
        number = float(value)
    except ValueError:
        raise BadRow(f"{field} = {value!r}: expected a number ({unit})") from None
    if not math.isfinite(number):
        raise BadRow(f"{field} = {value!r}: expected a finite number ({unit})")
    return number


def _hash_ids(value: Any, field: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) for h in value
    ):
        raise BadRow(f"{field}: expected a list of integers")
    return tuple(value)


_STAMP = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?\s*"
    r"(Z|[+-]\d{2}:?\d{2})?$"
)


@lru_cache(maxsize=64)
def _day_seconds(year: int, month: int, day: int) -> int:
    return (date(year, month, day).toordinal() - 719163) * 86400  # 719163: 1970-01-01


def parse_timestamp(text: str, field: str = "TIMESTAMP") -> float:
    """``YYYY-MM-DD HH:MM:SS[.f{1,9}][Z|+HH:MM]`` as seconds since 1970 (UTC if no zone).

    ``datetime.strptime``'s ``%f`` takes at most 6 digits; Azure 2023 has 7, so the fraction
    is read here directly.
    """
    match = _STAMP.match(text.strip())
    if match is None:
        raise BadRow(
            f"{field} = {text!r}: expected a time like 2023-11-16 18:15:46.6805900 "
            "(optionally with +00:00)"
        )
    year, month, day, hour, minute, sec = (int(g) for g in match.groups()[:6])
    fraction, zone = match.group(7), match.group(8)
    try:
        base = _day_seconds(year, month, day)
    except ValueError:
        raise BadRow(f"{field} = {text!r}: not a calendar date") from None
    if hour > 23 or minute > 59 or sec > 60:
        raise BadRow(f"{field} = {text!r}: time of day out of range")
    seconds = base + hour * 3600 + minute * 60 + sec
    offset = 0
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        offset = sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    frac = int(fraction) / 10 ** len(fraction) if fraction else 0.0
    return float(seconds - offset) + frac


# --- JSON-lines formats -----------------------------------------------------------------------


def _json_object(text: str) -> dict[str, Any]:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRow(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(record, dict):
        raise BadRow(f"expected a JSON object, got {type(record).__name__}")
    return record


def _require(record: dict[str, Any], field: str, where: str = "") -> Any:
    if field not in record or record[field] is None:
        raise BadRow(f"missing field {where}{field}")
    return record[field]


def parse_mooncake(text: str) -> Row | None:
    record = _json_object(text)
    ms = _number(_require(record, "timestamp"), "timestamp", "ms since trace start")
    return Row(
        time_s=ms / 1000.0,
        input_length=_tokens(_require(record, "input_length"), "input_length"),
        output_length=_tokens(_require(record, "output_length"), "output_length"),
        hash_ids=_hash_ids(record.get("hash_ids"), "hash_ids"),
    )


def parse_dynamo(text: str) -> Row | None:
    record = _json_object(text)
    schema = record.get("schema")
    if schema != DYNAMO_SCHEMA:
        raise BadRow(f"schema = {schema!r}: expected {DYNAMO_SCHEMA!r}")
    if record.get("event_type") != "request_end":
        return None
    request = _require(record, "request")
    if not isinstance(request, dict):
        raise BadRow("request: expected a JSON object")
    replay = request.get("replay")
    replay = replay if isinstance(replay, dict) else {}
    if request.get("request_received_ms") is not None:
        ms = _number(request["request_received_ms"], "request.request_received_ms", "unix ms")
    else:
        ms = _number(
            _require(record, "event_time_unix_ms", "request.request_received_ms or "),
            "event_time_unix_ms",
            "unix ms",
        )
    if replay.get("input_length") is not None:
        isl = _tokens(replay["input_length"], "request.replay.input_length")
    else:
        isl = _tokens(
            _require(request, "input_tokens", "request.replay.input_length or request."),
            "request.input_tokens",
        )
    osl = _tokens(_require(request, "output_tokens", "request."), "request.output_tokens")
    hashes = _hash_ids(replay.get("input_sequence_hashes"), "request.replay.input_sequence_hashes")
    return Row(time_s=ms / 1000.0, input_length=isl, output_length=osl, hash_ids=hashes)


def iter_json_lines(
    stream: TextIO, parse: Callable[[str], Row | None]
) -> Iterator[tuple[int, Row | BadRow | None]]:
    """``(line number, parsed row, None for a non-request, or the BadRow)`` per line."""
    for number, text in enumerate(stream, start=1):
        if not text.strip():
            continue
        try:
            yield number, parse(text)
        except BadRow as bad:
            yield number, bad


# --- CSV formats ------------------------------------------------------------------------------


def _column_index(header: list[str], required: tuple[str, ...]) -> dict[str, int] | str:
    names = [h.strip() for h in header]
    missing = [c for c in required if c not in names]
    if missing:
        return f"missing column(s) {', '.join(missing)}; header is {','.join(names)}"
    return {c: names.index(c) for c in required}


def iter_csv(stream: TextIO, fmt: str) -> Iterator[tuple[int, Row | BadRow | None]]:
    """``(line number, parsed row or BadRow)`` per data row of an Azure or BurstGPT CSV.

    The header is checked first: a missing column is a BadRow for the header line, and
    nothing else is read from that file.
    """
    reader = csv.reader(stream)
    try:
        header = next(reader)
    except StopIteration:
        return
    required = AZURE_COLUMNS if fmt == "azure" else BURSTGPT_COLUMNS
    index = _column_index(header, required)
    if isinstance(index, str):
        yield reader.line_num, BadRow(index)
        return
    width = max(index.values()) + 1
    t_col, i_col, o_col = (index[c] for c in required)
    parse = _azure_row if fmt == "azure" else _burstgpt_row
    for row in reader:
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) < width:
            yield (
                reader.line_num,
                BadRow(f"{len(row)} column(s): expected at least {width} ({','.join(required)})"),
            )
            continue
        try:
            yield reader.line_num, parse(row, t_col, i_col, o_col)
        except BadRow as bad:
            yield reader.line_num, bad


def _azure_row(row: list[str], t: int, i: int, o: int) -> Row:
    return Row(
        time_s=parse_timestamp(row[t]),
        input_length=_tokens(row[i], "ContextTokens"),
        output_length=_tokens(row[o], "GeneratedTokens"),
    )


def _burstgpt_row(row: list[str], t: int, i: int, o: int) -> Row:
    return Row(
        time_s=_number(row[t], "Timestamp", "s since the first day's midnight"),
        input_length=_tokens(row[i], "Request tokens"),
        output_length=_tokens(row[o], "Response tokens"),
    )


# --- detection --------------------------------------------------------------------------------


def detect_format(first_line: str) -> str | None:
    """The format a file's first non-blank line belongs to, or None if unknown."""
    text = first_line.strip().lstrip("\ufeff")
    if text.startswith("{"):
        try:
            record = json.loads(text)
        except json.JSONDecodeError:
            return None
        if not isinstance(record, dict):
            return None
        if record.get("schema") == DYNAMO_SCHEMA:
            return "dynamo"
        if all(f in record for f in MOONCAKE_FIELDS):
            return "mooncake"
        return None
    header = {h.strip() for h in next(csv.reader([text]), [])}
    if set(AZURE_COLUMNS) <= header:
        return "azure"
    if set(BURSTGPT_COLUMNS) <= header:
        return "burstgpt"
    return None


def iter_rows(stream: TextIO, fmt: str) -> Iterator[tuple[int, Row | BadRow | None]]:
    """Dispatch to the row iterator of ``fmt``."""
    if fmt == "mooncake":
        return iter_json_lines(stream, parse_mooncake)
    if fmt == "dynamo":
        return iter_json_lines(stream, parse_dynamo)
    return iter_csv(stream, fmt)
