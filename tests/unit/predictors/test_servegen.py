"""ServeGen client descriptions as a trace: requests generated from the real m-large files
(counts, burstiness, lengths, seeds), the options, and bad input named by file, line, field."""

from __future__ import annotations

import ast
import csv
import itertools
import json
import math
import statistics
from pathlib import Path

import pytest

from disagg_planner.cli.main import main
from disagg_planner.predictors.kalman import KalmanPredictor
from disagg_planner.predictors.traces import TraceError, TraceRequest, read_trace
from disagg_planner.predictors.warmup import warm_up

DAY = 86400


def requests(spec: str, **kwargs: object) -> list[TraceRequest]:
    return list(read_trace(spec, **kwargs))  # type: ignore[arg-type]


def window_rates(folder: Path, client: str) -> dict[int, float]:
    with (folder / f"chunk-{client}-trace.csv").open() as f:
        return {int(float(row[0])): float(row[1]) for row in csv.reader(f)}


def pmf(folder: Path, client: str, block: int, field: str) -> dict[int, float]:
    data = json.loads((folder / f"chunk-{client}-dataset.json").read_text())
    return ast.literal_eval(data[str(block)][field])


def gaps_cv(arrivals: list[float]) -> float:
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    return statistics.pstdev(gaps) / statistics.fmean(gaps)


def test_window_counts_follow_the_described_rates(servegen_m_large: Path) -> None:
    spec = f"servegen:{servegen_m_large},clients=61,start=1d,span=6h,scale=0.01"
    reader = read_trace(spec)
    got = list(reader)
    assert reader.format == "servegen"
    assert reader.files == [
        servegen_m_large / "chunk-61-trace.csv",
        servegen_m_large / "chunk-61-dataset.json",
    ]
    assert reader.requests == len(got) and reader.bad_rows == 0
    rates = window_rates(servegen_m_large, "61")
    windows = range(DAY, DAY + 6 * 3600, 600)
    expected = sum(rates[t] * 600 * 0.01 for t in windows)
    # Each window's count is its expectation rounded at random: off by less than one each.
    assert abs(len(got) - expected) < len(windows)
    arrivals = [r.arrival_s for r in got]
    assert arrivals == sorted(arrivals) and arrivals[0] >= 0 and arrivals[-1] < 6 * 3600
    # Time counts from start=, idle windows included (the client is idle at 1d).
    assert rates[DAY] == 0 and arrivals[0] > 600
    per_window = [sum(1 for t in arrivals if i * 600 <= t < (i + 1) * 600) for i in range(36)]
    for count, t in zip(per_window, windows, strict=True):
        assert abs(count - rates[t] * 6) < 1.5


@pytest.mark.slow
def test_burstiness_within_a_window_is_the_fitted_law(servegen_m_large: Path) -> None:
    # chunk-61: 88800 s is a Weibull window (shape 0.33, CV 6.8 as described), 600 s a
    # Gamma one (shape 0.93, CV 1.04).
    folder = servegen_m_large
    bursty = [r.arrival_s for r in requests(f"servegen:{folder},clients=61,start=88800,span=600")]
    smooth = [r.arrival_s for r in requests(f"servegen:{folder},clients=61,start=600,span=600")]
    assert len(bursty) == pytest.approx(5.1933 * 600, abs=1)
    assert 2.5 < gaps_cv(bursty) < 9
    assert gaps_cv(smooth) == pytest.approx(1 / math.sqrt(0.9278), rel=0.1)


def test_lengths_follow_the_block_pmf(servegen_m_large: Path) -> None:
    got = requests(f"servegen:{servegen_m_large},clients=61,start=1d,span=6h,scale=0.01")
    isl = pmf(servegen_m_large, "61", DAY, "input_tokens")
    osl = pmf(servegen_m_large, "61", DAY, "output_tokens")
    assert {r.input_length for r in got} <= set(isl)
    assert {r.output_length for r in got} <= set(osl)
    mean_isl = sum(k * p for k, p in isl.items())
    assert statistics.fmean(r.input_length for r in got) == pytest.approx(mean_isl, rel=0.05)


def test_a_client_without_lengths_draws_from_the_pool(servegen_m_large: Path) -> None:
    # chunk-142 has no dataset.json; its lengths come from the five clients that have one.
    reader = read_trace(f"servegen:{servegen_m_large},clients=142,start=1d,span=1h,scale=0.05")
    got = list(reader)
    assert got
    pooled: set[int] = set()
    for client in ("104", "143", "34", "61", "78"):
        pooled |= set(pmf(servegen_m_large, client, DAY, "input_tokens"))
        assert servegen_m_large / f"chunk-{client}-dataset.json" in reader.files
    assert {r.input_length for r in got} <= pooled


def test_seeded_reproducible_and_clients_independent(servegen_m_large: Path) -> None:
    base = f"servegen:{servegen_m_large},start=2d,span=1h,scale=0.01"
    one = requests(base + ",clients=61/34")
    assert one == requests(base + ",clients=chunk-61/chunk-34")
    assert one != requests(base + ",clients=61/34,seed=1")
    alone = requests(base + ",clients=61") + requests(base + ",clients=34")
    # Each client has its own stream: together they are the two alone, merged.
    assert one == sorted(alone, key=lambda r: r.arrival_s)


def test_a_day_compressed_to_an_hour_at_a_chosen_mean_rate(servegen_m_large: Path) -> None:
    got = requests(f"servegen:{servegen_m_large},start=1d,span=1d,speedup=24,rate=2")
    assert got[-1].arrival_s < 3600
    assert len(got) / 3600 == pytest.approx(2, rel=0.02)
    # The model's day keeps its shape: the busiest compressed 5 minutes against the quietest.
    per_5min = [sum(1 for r in got if i * 300 <= r.arrival_s < (i + 1) * 300) for i in range(12)]
    assert max(per_5min) > 2 * min(per_5min)


@pytest.mark.slow
def test_servegen_everywhere_a_trace_is_accepted(
    servegen_m_large: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = f"servegen:{servegen_m_large},clients=61,start=1d,span=2h,rate=3"
    report = warm_up({"num_req": KalmanPredictor()}, spec, interval_s=180)
    assert report.trace_format == "servegen" and report.intervals == 39
    assert main(["backtest", "--trace", spec, "--predictor", "constant", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert {r["series"] for r in results} == {"num_req", "isl", "osl"}
    dir_form = ["--trace-format", "servegen", "--trace", f"{servegen_m_large},span=1h,scale=0.001"]
    assert main(["backtest", *dir_form, "--interval", "600", "--json"]) == 0


# --- bad input ----------------------------------------------------------------------------------

GOOD_ROW = "0,1.0,1.0,Gamma,1.0,0.5"
LENGTHS = {"0": {"input_tokens": "{100: 0.5, 200: 0.5}", "output_tokens": "{10: 1.0}"}}


def folder_with(tmp_path: Path, rows: list[str], lengths: object = LENGTHS) -> Path:
    (tmp_path / "chunk-7-trace.csv").write_text("\n".join(rows) + "\n")
    if lengths is not None:
        (tmp_path / "chunk-7-dataset.json").write_text(json.dumps(lengths))
    return tmp_path


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("600,fast,1.0,Gamma,1.0,0.5", "chunk-7-trace.csv:2: rate = 'fast': expected a finite"),
        ("600,1.0,1.0,Lognormal,1.0,0.5", ":2: distribution = 'Lognormal': expected Gamma or"),
        ("600,1.0,1.0,Gamma,0,0.5", ":2: shape = '0': expected a finite number > 0"),
        ("650,1.0,1.0,Gamma,1.0,0.5", ":2: window start = '650': expected a multiple of 600"),
        ("0,1.0,1.0,Gamma,1.0,0.5", ":2: window start = '0': expected windows in increasing"),
        ("600,1.0,1.0,Gamma", ":2: 4 column(s): expected 6 (window start, rate, cv,"),
    ],
)
def test_bad_window_rows_name_file_line_and_field(tmp_path: Path, row: str, message: str) -> None:
    folder = folder_with(tmp_path, [GOOD_ROW, row, "1200,1.0,1.0,Gamma,1.0,0.5"])
    with pytest.raises(TraceError) as info:
        read_trace(f"servegen:{folder}")
    assert message in str(info.value)
    assert info.value.path == str(folder / "chunk-7-trace.csv") and info.value.line == 2
    # Skipped, that window is idle and counted.
    reader = read_trace(f"servegen:{folder}", skip_bad_rows=True)
    got = list(reader)
    assert reader.bad_rows == 1 and message.split(": ", 1)[1] in reader.bad_examples[0]
    assert len(got) == 1200  # windows 0 and 1200, 600 requests each
    assert not [r for r in got if 600 <= r.arrival_s < 1200]


@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        ({"0": {"input_tokens": "{100: 0.5", "output_tokens": "{1: 1}"}}, "key '0': input_tokens:"),
        ({"0": {"input_tokens": "__import__('os')", "output_tokens": "{1: 1}"}}, "not a Python"),
        ({"0": {"input_tokens": "{100: -1}", "output_tokens": "{1: 1}"}}, "probability of 100"),
        ({"0": {"input_tokens": "{'a': 1}", "output_tokens": "{1: 1}"}}, "length 'a': expected"),
        ({"0": {"input_tokens": "{1: 1}"}}, "key '0': output_tokens: expected a string"),
        ({"0": {"input_tokens": "{1: 0}", "output_tokens": "{1: 1}"}}, "every probability is 0"),
        ({"zero": {}}, "key 'zero': expected a block start in whole seconds"),
        ({"600": LENGTHS["0"]}, "no length distribution for the window at 0 s"),
    ],
)
def test_bad_length_files_name_file_block_and_field(
    tmp_path: Path, lengths: object, message: str
) -> None:
    folder = folder_with(tmp_path, [GOOD_ROW], lengths)
    with pytest.raises(TraceError) as info:
        requests(f"servegen:{folder}", skip_bad_rows=True)
    assert message in str(info.value)
    assert str(folder / "chunk-7-dataset.json") in str(info.value)


def test_broken_json_names_its_line(tmp_path: Path) -> None:
    folder = folder_with(tmp_path, [GOOD_ROW], None)
    (folder / "chunk-7-dataset.json").write_text('{\n"0": {\n}}}')
    with pytest.raises(TraceError, match=r"chunk-7-dataset.json:3: not valid JSON"):
        requests(f"servegen:{folder}")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (",clients=9", "clients=9: no chunk-<client>-trace.csv for them; this folder has 7"),
        (",clients=a/b", "clients='a/b': expected client numbers"),
        (",day=3", "unknown option 'day'; known: clients, start, span, speedup"),
        (",speedup=0", "speedup='0': expected a number > 0"),
        (",start=soon", "start='soon': expected seconds, e.g. 600"),
        (",span=0", "span='0': expected a duration > 0"),
        (",scale=2,rate=3", "give scale= or rate=, not both"),
        (",start=2d", "start=172800 s is past the trace's end (600 s)"),
        (",seed=-1", "seed='-1': expected a whole number"),
        (",rate", "'rate' is not key=value"),
    ],
)
def test_bad_options_are_named(tmp_path: Path, options: str, message: str) -> None:
    folder = folder_with(tmp_path, [GOOD_ROW])
    with pytest.raises(TraceError) as info:
        requests(f"servegen:{folder}{options}")
    assert message in str(info.value)


def test_a_folder_without_the_prefix_or_lengths(tmp_path: Path) -> None:
    folder = folder_with(tmp_path, [GOOD_ROW], None)
    with pytest.raises(TraceError, match=r"ServeGen client descriptions .* pass servegen:"):
        read_trace(folder)
    with pytest.raises(TraceError, match="no client in this folder has a chunk-<client>-dataset"):
        read_trace(f"servegen:{folder}")
    with pytest.raises(TraceError, match="no such directory"):
        read_trace(f"servegen:{folder / 'nowhere'}")


def test_the_pool_mixes_per_request_by_the_members_requests(tmp_path: Path) -> None:
    # Clients 1 and 2 have lengths (100 and 900 tokens), client 2 sending three times the
    # requests of client 1; client 3 has none: each of its requests draws from the pool.
    def client(name: str, rate: float, isl: int | None) -> None:
        (tmp_path / f"chunk-{name}-trace.csv").write_text(f"0,{rate},1.0,Gamma,1.0,0.5\n")
        if isl is not None:
            pmfs = {"input_tokens": f"{{{isl}: 1.0}}", "output_tokens": "{5: 1.0}"}
            (tmp_path / f"chunk-{name}-dataset.json").write_text(json.dumps({"0": pmfs}))

    client("1", 1.0, 100)
    client("2", 3.0, 900)
    client("3", 4.0, None)
    got = requests(f"servegen:{tmp_path},clients=3")
    assert len(got) == 2400
    share = sum(1 for r in got if r.input_length == 900) / len(got)
    assert {r.input_length for r in got} == {100, 900}
    assert share == pytest.approx(0.75, abs=0.03)


def test_an_empty_block_takes_the_pool(tmp_path: Path) -> None:
    # Real files have them (m-large chunk-104 at 0 s: "{}"): the client's own PMF is empty
    # there, so its requests take the pool's lengths.
    for name, isl in (("1", "{}"), ("2", "{900: 1.0}")):
        (tmp_path / f"chunk-{name}-trace.csv").write_text("0,1.0,1.0,Gamma,1.0,0.5\n")
        pmfs = {"input_tokens": isl, "output_tokens": "{5: 1.0}"}
        (tmp_path / f"chunk-{name}-dataset.json").write_text(json.dumps({"0": pmfs}))
    reader = read_trace(f"servegen:{tmp_path},clients=1")
    assert {r.input_length for r in reader} == {900}
    assert tmp_path / "chunk-2-dataset.json" in reader.files
