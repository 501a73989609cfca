"""A live planner's report, rendered in a short-lived child process.

Why: rendering imports plotly and the report code (about 40 MiB of modules that then stay)
and peaks near 100 MiB of heap for a day of 5 s ticks, which the C allocator keeps after the
render is done. In an operator that runs for months the first scheduled report would raise
its resident set for good (``benchmarks/soak.py``: 74 -> 182 MiB at the first report and
never back to day 1), and renders of many policies falling close together would stack their
peaks. A child process takes all of it and returns it on exit; the operator keeps only its
rolling window.

Protocol (``python -m disagg_planner.report.child [--out FILE]``): stdin holds one JSON
header line (``title``, ``ttft_slo_ms``, ``itl_slo_ms``), then one tick's JSON per line
(:meth:`TickSnapshot.to_json`). The HTML goes to ``--out`` (written there, so that the
parent never holds it) or to stdout; a failure exits non-zero with its traceback on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

RENDER_TIMEOUT_S = 300.0


class ReportRenderError(RuntimeError):
    """The child process failed to render (its exit status and the end of its stderr)."""


def render_in_child(
    lines: Iterable[bytes],
    *,
    title: str,
    ttft_slo_ms: float | None,
    itl_slo_ms: float | None,
    out: Path | None = None,
    timeout_s: float = RENDER_TIMEOUT_S,
) -> str | None:
    """Render the ticks ``lines`` (each a tick's JSON) in a child process; the HTML, or None
    when it was written to ``out``. Raises :class:`ReportRenderError` when the child fails."""
    header = json.dumps({"title": title, "ttft_slo_ms": ttft_slo_ms, "itl_slo_ms": itl_slo_ms})
    package_root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": package_root + (os.pathsep + path if path else "")}
    command = [sys.executable, "-m", "disagg_planner.report.child"]
    if out is not None:
        command += ["--out", str(out)]
    # The ticks are streamed a line at a time and the answer goes through files: the parent
    # never holds the whole window decoded, nor the HTML it writes to ``out``.
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        child = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=stdout, stderr=stderr, env=env
        )
        assert child.stdin is not None
        try:
            with child.stdin:
                child.stdin.write(header.encode() + b"\n")
                for line in lines:
                    child.stdin.write(line + b"\n")
            returncode = child.wait(timeout_s)
        except subprocess.TimeoutExpired as exc:
            child.kill()
            child.wait()
            raise ReportRenderError(f"the report's child process ran past {timeout_s:g} s") from exc
        except BrokenPipeError:
            returncode = child.wait(timeout_s)
        if returncode != 0:
            stderr.seek(0)
            tail = stderr.read().decode(errors="replace")[-2000:]
            raise ReportRenderError(f"the report's child process exited {returncode}: {tail}")
        if out is not None:
            return None
        stdout.seek(0)
        return stdout.read().decode()


def main(argv: Sequence[str] | None = None) -> int:
    # imported here, in the child only: the recorder of a live process imports this module
    # for render_in_child, and must not load plotly and the report code with it
    from disagg_planner.report.html import render_report
    from disagg_planner.report.snapshot import TickSnapshot

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    stream = sys.stdin.buffer
    header = json.loads(stream.readline())
    snapshots = [TickSnapshot.from_json(json.loads(line)) for line in stream if line.strip()]
    if not snapshots:
        raise SystemExit("no ticks on stdin")
    html = render_report(
        snapshots,
        title=header["title"],
        ttft_slo_ms=header["ttft_slo_ms"],
        itl_slo_ms=header["itl_slo_ms"],
    )
    if args.out is not None:
        args.out.write_text(html, encoding="utf-8")
    else:
        sys.stdout.write(html)
    return 0


if __name__ == "__main__":
    sys.exit(main())
