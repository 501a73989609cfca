"""summary.json through its type: a real replay's file reads back into ReplaySummary and
writes out byte for byte, a malformed one is refused naming the file and the field, the
targets keep one name in Python while the file keeps its keys, and the terminal table says
whether each policy met its attainment target."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from disagg_planner.cli.main import main
from disagg_planner.errors import SpecError
from disagg_planner.replay.replay_summary import Attainment, ReplaySummary
from disagg_planner.replay.summary import summary_table

PROFILE = "h200_sxm/vllm/llama-3.1-8b-fp8/tp1"


@pytest.fixture(scope="module")
def replay_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short replay with the references (every block of summary.json but the elastic and
    fleet ones)."""
    out = tmp_path_factory.mktemp("summary") / "out"
    argv = [
        "replay", "--workload", "step:rates=2/6,at=60,duration=120,isl=1000,osl=100",
        "--profile", PROFILE, "--ttft", "500", "--itl", "30", "--startup-delay", "30",
        "--policy", "planner", "--no-progress", "-o", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    return out


def test_a_real_summary_reads_back_and_writes_out_byte_for_byte(
    replay_out: Path, tmp_path: Path
) -> None:
    written = (replay_out / "summary.json").read_bytes()
    summary = ReplaySummary.read(replay_out / "summary.json")
    assert summary.references is not None and summary.setup is not None
    assert summary.config is not None and summary.config["profile"] == PROFILE
    summary.write(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == written
    # and the objects are equal, not only their text
    assert ReplaySummary.from_json(json.loads(written)) == summary


def test_the_targets_have_one_name_in_python_and_keep_their_keys_in_the_file(
    replay_out: Path,
) -> None:
    data = json.loads((replay_out / "summary.json").read_text())
    summary = ReplaySummary.from_json(data)
    assert summary.slo is not None
    assert summary.slo.ttft_target_ms == data["slo"]["ttft_ms"] == 500.0
    assert summary.slo.itl_target_ms == data["slo"]["itl_ms"] == 30.0
    # ttft_ms is what was observed: the percentiles of the requests' TTFTs
    assert summary.ttft_ms.p99 == data["ttft_ms"]["p99"]
    refs = summary.references
    assert refs is not None
    assert refs.search_attainment_target == data["slo_target"]
    assert refs.best_static.attainment_both == data["best_static"]["slo_attainment"]


def _broken(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """``data`` with the field at dotted ``path`` set to ``value`` (``...``: removed)."""
    broken = json.loads(json.dumps(data))
    *parents, last = path.split(".")
    node = broken
    for key in parents:
        node = node[key]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return broken


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("gpu_hours", ..., "missing field 'gpu_hours'"),
        (
            "slo_attainment.both",
            "high",
            "field 'slo_attainment.both': expected a number, got 'high'",
        ),
        ("requests", 12.5, "field 'requests': expected a whole number, got 12.5"),
        ("scale_actions.prefill", True, "field 'scale_actions.prefill': expected a whole number"),
        ("best_static.replicas", [1, 1], "field 'best_static.replicas': expected an object"),
        # the references come together: one of them there, the others must be too
        ("oracle_plan", ..., "missing field 'oracle_plan'"),
        ("slo.ttft_ms", ..., "missing field 'slo.ttft_ms'"),
        ("policy", None, "field 'policy': expected a string, got None"),
    ],
)
def test_a_malformed_summary_is_refused_naming_the_file_and_field(
    replay_out: Path, tmp_path: Path, path: str, value: Any, message: str
) -> None:
    data = json.loads((replay_out / "summary.json").read_text())
    target = tmp_path / "summary.json"
    target.write_text(json.dumps(_broken(data, path, value)))
    with pytest.raises(SpecError) as caught:
        ReplaySummary.read(target)
    assert str(caught.value).startswith(f"{target}: ")
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [("{not json", "not JSON"), ("[1, 2]", "the top level: expected an object")],
)
def test_a_file_that_is_no_summary_is_refused(tmp_path: Path, text: str, message: str) -> None:
    target = tmp_path / "summary.json"
    target.write_text(text)
    with pytest.raises(SpecError, match=f"{target}: .*{message}"):
        ReplaySummary.read(target)


def test_the_table_says_whether_each_policy_meets_its_attainment_target(
    replay_out: Path,
) -> None:
    summary = ReplaySummary.read(replay_out / "summary.json")
    assert summary.slo is not None
    target = summary.slo.attainment_target
    met = replace(summary, policy="met", slo_attainment=Attainment(1.0, 1.0, target))
    missed = replace(summary, policy="missed", slo_attainment=Attainment(1.0, 1.0, target - 0.01))
    unscored = replace(summary, policy="unscored", setup=None)
    header, *rows = (_cells(line) for line in summary_table([met, missed, unscored]).splitlines())
    column = header.index("meets target")
    verdicts = {row[0]: row[column] for row in rows}
    percent = f"({target:.0%})"
    assert verdicts == {"met": f"yes {percent}", "missed": f"no {percent}", "unscored": "-"}


def _cells(line: str) -> list[str]:
    """The table's columns: 12 characters each, two spaces apart."""
    return [line[i : i + 12].strip() for i in range(0, len(line), 14)]
