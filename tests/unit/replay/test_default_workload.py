"""The default replay workload: generated from the packaged facts, and the facts themselves
(regenerated from the shared Azure trace where it is at hand)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from disagg_planner.replay import default_workload
from disagg_planner.replay.default_workload import (
    DEFAULT_DURATION_S,
    DEFAULT_SCALE_LOAD,
    DEFAULT_SPEEDUP,
    WorkloadFacts,
    measure,
    packaged_facts,
)
from disagg_planner.replay.session import WorkloadSpec, load_requests


def packaged_json() -> dict:
    text = resources.files("disagg_planner.replay").joinpath("default_workload.json").read_text()
    return json.loads(text)


def test_each_minute_gets_its_measured_count() -> None:
    facts = packaged_facts()
    requests = list(default_workload.requests(seed=0))
    arrivals = np.array([r.arrival_s for r in requests])
    assert np.all(np.diff(arrivals) >= 0)
    counts = np.bincount((arrivals // 60).astype(int), minlength=len(facts.by_minute))
    assert counts.tolist() == packaged_json()["requests_per_minute"]
    assert arrivals.max() < 60 * len(facts.by_minute)
    assert min(min(r.input_length, r.output_length) for r in requests) >= 1


def test_seeded() -> None:
    first = list(default_workload.requests(seed=3))
    assert first == list(default_workload.requests(seed=3))
    assert first != list(default_workload.requests(seed=4))


def test_lengths_keep_the_trace_isl_osl_dependence() -> None:
    # The Azure trace's mean OSL per ISL quartile over its hour is about 114, 194, 408, 129
    # tokens (mean ISL 1,150, OSL 211): drawing ISL and OSL independently would flatten that.
    requests = list(default_workload.requests(seed=0))
    isl = np.array([r.input_length for r in requests])
    osl = np.array([r.output_length for r in requests])
    assert isl.mean() == pytest.approx(1150, rel=0.05)
    assert osl.mean() == pytest.approx(211, rel=0.05)
    quartile = np.digitize(isl, np.percentile(isl, [25, 50, 75]))
    means = [osl[quartile == q].mean() for q in range(4)]
    assert means == pytest.approx([114, 194, 408, 129], rel=0.15)


@pytest.mark.slow
def test_the_cli_default_needs_no_file() -> None:
    # replay's defaults with neither --trace nor --workload: 4 clones of the 19,329 requests
    # of the trace's 58 whole minutes, compressed 2x
    spec = WorkloadSpec(
        speedup=DEFAULT_SPEEDUP, scale_load=DEFAULT_SCALE_LOAD, duration_s=DEFAULT_DURATION_S
    )
    requests = load_requests(spec)
    assert len(requests) == 4 * 19329
    assert max(r.arrival_s for r in requests) < 58 * 60 / DEFAULT_SPEEDUP + spec.clone_jitter_s


def test_per_minute_counts_must_match_the_bins() -> None:
    data = packaged_json()
    data["requests_per_minute"][0] += 1
    with pytest.raises(ValueError, match="row sums"):
        WorkloadFacts.from_json(data)


def test_facts_file_is_what_from_trace_writes(azure_trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "facts.json"
    assert default_workload.main(["--from-trace", str(azure_trace), "-o", str(out)]) == 0
    packaged = resources.files("disagg_planner.replay").joinpath("default_workload.json")
    assert out.read_text() == packaged.read_text()


def test_measuring_another_file_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    other.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.68,3,4\r\n")
    with pytest.raises(SystemExit, match=r"is not that of https://github\.com/Azure"):
        measure(other)
