"""Files generated from the code and committed (CRDs, the Helm values schema, the Grafana
dashboard): write them, or check that the committed copies are current (CI does)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path


def sync_generated(files: Mapping[Path, str], *, check: bool, command: str) -> int:
    """Write each ``path: text`` that differs from the file on disk, or with ``check`` write
    nothing and name the stale files on stderr with ``command``, the one that regenerates
    them. Returns the exit status: 1 when checking found a stale file, else 0."""
    stale = []
    for path, text in files.items():
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(path)
        if not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    for path in stale:
        if check:
            print(f"{path} is out of date: run {command}", file=sys.stderr)
        else:
            print(f"wrote {path}")
    return 1 if check and stale else 0
