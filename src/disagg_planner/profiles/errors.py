"""The one error this library raises for a bad profile.

It derives from ``ValueError`` so callers that do not know this package still catch it; the
command line maps it to its own ``ProfileError`` (exit status 2) by module and name.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

__all__ = ["ProfileError"]


class ProfileError(ValueError):
    """A performance profile (or its manifest) is missing or malformed.

    The message names, as far as they are known, the file, the key, the offending index and
    value, and the rule that was broken, e.g.
    ``.../raw_data.npz: prefill_ttft[3] = nan: must be a finite number``.
    The same parts are kept as attributes for programs that want to react to them.
    """

    def __init__(
        self,
        rule: str,
        *,
        file: str | Path | None = None,
        key: str | None = None,
        index: int | tuple[int, ...] | None = None,
        value: object = None,
        has_value: bool | None = None,
    ) -> None:
        self.rule = rule
        self.file = None if file is None else str(file)
        self.key = key
        self.index = index
        self.value = value
        # ``None`` can itself be the offending value (a JSON null), so whether a value is part
        # of the message is explicit; by default it is when an index or key is given.
        self.has_value = (index is not None) if has_value is None else has_value
        super().__init__(self._render())

    def _render(self) -> str:
        where = ""
        if self.key is not None:
            where = self.key
            if self.index is not None:
                idx = self.index if isinstance(self.index, tuple) else (self.index,)
                where += "".join(f"[{i}]" for i in idx)
            if self.has_value:
                where += f" = {_show(self.value)}"
        parts = [p for p in (self.file, where) if p]
        return ": ".join([*parts, self.rule])


def _show(value: object) -> str:
    """A value as a user wrote it: numbers without numpy's type wrapper."""
    if hasattr(value, "item") and callable(value.item):
        with contextlib.suppress(ValueError, TypeError):
            value = value.item()
    return repr(value)
