"""The error a malformed or missing trace raises (mapped to exit code 2 by the CLI)."""

from __future__ import annotations

from pathlib import Path


class TraceError(ValueError):
    """A request trace is missing, of an unknown format, or has a bad row.

    ``path`` and ``line`` (1-based, physical line in the file) say where, when known; the
    message starts with ``path:line:`` so one line on stderr is enough to find the problem.
    """

    def __init__(self, message: str, *, path: str | Path | None = None, line: int | None = None):
        self.path = None if path is None else str(path)
        self.line = line
        self.reason = message
        where = ""
        if self.path is not None:
            where = f"{self.path}:{line}: " if line is not None else f"{self.path}: "
        super().__init__(where + message)
