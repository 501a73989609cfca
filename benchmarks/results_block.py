"""Replace (or append) one generated block ``<!-- BEGIN name -->...<!-- END name -->`` of
benchmarks/RESULTS.md: what the benchmarks of issue 36 write their output into."""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def markers(name: str) -> tuple[str, str]:
    return f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"


def write_block(name: str, block: str, path: Path = RESULTS) -> None:
    """``block`` (starting and ending with the markers of ``name``) into ``path``."""
    begin, end = markers(name)
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)
