"""benchmarks/replay_memory.py's measure: the resident sets of a process and all of its
descendants summed (a replay's ``--jobs`` workers live beside it, so the machine needs their
sum, which ``ru_maxrss`` of the largest one does not give)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.unit.benchmarks.scripts import load_script

MIB = 2**20

pytestmark = pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc")


def test_the_tree_counts_a_child_and_its_child() -> None:
    bench = load_script("replay_memory")
    before = bench.tree_rss_bytes(os.getpid())
    own = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    assert before >= own
    # a child that starts a grandchild holding 200 MiB (touched, so resident)
    code = (
        "import subprocess, sys; subprocess.run([sys.executable, '-c', "
        '"b = bytearray(200 * 2**20); import time; time.sleep(30)"])'
    )
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 20
        grown = 0
        while time.monotonic() < deadline:
            grown = bench.tree_rss_bytes(os.getpid()) - before
            if grown >= 200 * MIB:
                break
            time.sleep(0.2)
        assert grown >= 200 * MIB, f"the tree grew {grown / MIB:.0f} MiB"
        # the child alone, its grandchild included
        assert bench.tree_rss_bytes(child.pid) >= 200 * MIB
    finally:
        for pid in _descendants(child.pid):
            os.kill(pid, 9)
        child.kill()
        child.wait()


def _descendants(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                out.append(int(entry.name))
    return out
