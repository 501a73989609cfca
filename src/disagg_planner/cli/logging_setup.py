"""Logging for the command line and the controller: text for people, JSON for collectors.

Modules log through ``logging.getLogger(__name__)``, so each package has its own logger
(``planner``, ``predictors``, ``simulator`` ...) and levels can be set per package.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

_NOISY_LIBRARIES = ("cmdstanpy", "prophet", "urllib3", "kubernetes", "aiohttp", "kopf")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and any ``extra`` fields."""

    _RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message"}

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in self._RESERVED and not key.startswith("_"):
                payload[key] = value if isinstance(value, str | int | float | bool) else str(value)
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted, so a replaced stderr
    (a test's capture, a daemon's redirect) never leaves the handler on a closed stream."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        return


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Send every package's records to stderr in the chosen format (idempotent)."""
    handler = _StderrHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in _NOISY_LIBRARIES:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
