"""Trace readers (every format, file/glob/directory/gzip, bad rows) and interval bucketing."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from disagg_planner.predictors.traces import TraceError, TraceRequest, bucket_trace, read_trace

DATA = Path(__file__).parent / "data"
AZURE_PER_MINUTE = DATA / "azure_conv_2023_per_minute.csv"

BURSTGPT_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8", newline="")
    return path


def dynamo_end(received_ms: int | None, *, isl: int = 100, osl: int = 10, **extra) -> str:
    request: dict = {"request_id": f"r{received_ms}", "output_tokens": osl}
    if received_ms is not None:
        request["request_received_ms"] = received_ms
    request["replay"] = {"trace_block_size": 64, "input_length": isl, "input_sequence_hashes": [7]}
    record = {
        "schema": "dynamo.request.trace.v1",
        "event_type": "request_end",
        "event_time_unix_ms": (received_ms or 0) + 500,
        "request": request,
    }
    record.update(extra)
    return json.dumps(record) + "\n"


# --- the real slices ---------------------------------------------------------------------


def test_azure_2023_slice_crlf_seven_digit_fractions(azure_head: Path) -> None:
    reader = read_trace(azure_head)
    requests = list(reader)
    assert reader.format == "azure"
    assert len(requests) == reader.requests == 300
    # 18:15:46.6805900 -> 18:15:50.9951690, exactly, despite the 7th digit
    assert requests[0] == TraceRequest(arrival_s=0.0, input_length=374, output_length=44)
    assert requests[1].arrival_s == pytest.approx(4.314579, abs=1e-6)
    assert (requests[1].input_length, requests[1].output_length) == (396, 109)
    arrivals = [r.arrival_s for r in requests]
    assert arrivals == sorted(arrivals)


def test_mooncake_slice_ms_timestamps_and_hash_ids(mooncake_head: Path) -> None:
    reader = read_trace(mooncake_head)
    requests = list(reader)
    assert reader.format == "mooncake"
    assert len(requests) == 300
    assert requests[0].hash_ids == tuple(range(14))
    assert (requests[0].input_length, requests[0].output_length) == (6758, 500)
    raw = [json.loads(line) for line in mooncake_head.read_text().splitlines()]
    assert [r.arrival_s for r in requests] == [row["timestamp"] / 1000 for row in raw]


def test_slice_bucketed_matches_the_full_trace_first_minute(azure_head: Path) -> None:
    # the per-minute file was bucketed from the whole trace; its first minute lies wholly
    # inside the 300-row slice, so both must agree
    first = AZURE_PER_MINUTE.read_text().splitlines()[1].split(",")
    interval = bucket_trace(read_trace(azure_head), interval_s=60)[0]
    assert interval.num_req == int(first[1]) == 191
    assert interval.mean_isl == pytest.approx(float(first[2]), abs=1e-3)
    assert interval.mean_osl == pytest.approx(float(first[3]), abs=1e-3)
    assert sum(interval.isl_counts) == sum(interval.osl_counts) == 191


# --- other formats -------------------------------------------------------------------------


def test_azure_2024_offsets_and_missing_fraction(tmp_path: Path) -> None:
    path = write(
        tmp_path / "code_1week.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-10 00:00:00.009930+00:00,4808,10\n"
        "2024-05-10 00:00:01+00:00,3180,8\n"
        "2024-05-10 01:00:02.5+01:00,110,27\n",
    )
    requests = list(read_trace(path))
    assert [r.arrival_s for r in requests] == pytest.approx([0.0, 0.99007, 2.49007])
    assert [r.input_length for r in requests] == [4808, 3180, 110]


def test_burstgpt_keeps_failures_with_zero_output(tmp_path: Path) -> None:
    path = write(
        tmp_path / "BurstGPT_1.csv",
        BURSTGPT_HEADER
        + "5,ChatGPT,472,18,490,Conversation log\n"
        + "45,ChatGPT,1087,0,1087,Conversation log\n"
        + "118,GPT-4,417,276,693,API log\n",
    )
    reader = read_trace(path)
    requests = list(reader)
    assert reader.format == "burstgpt"
    assert [(r.arrival_s, r.input_length, r.output_length) for r in requests] == [
        (0.0, 472, 18),
        (40.0, 1087, 0),
        (113.0, 417, 276),
    ]


def test_dynamo_v1_unordered_ends_other_events_and_fallback_fields(tmp_path: Path) -> None:
    no_replay = json.loads(dynamo_end(None, osl=3))
    del no_replay["request"]["replay"]
    no_replay["request"]["input_tokens"] = 42
    no_replay["event_time_unix_ms"] = 1_000_900
    path = write(
        tmp_path / "dynamo-request-trace.000001.jsonl",
        dynamo_end(1_002_000, isl=128, osl=4)
        + json.dumps({"schema": "dynamo.request.trace.v1", "event_type": "tool_end"})
        + "\n"
        + dynamo_end(1_000_000, isl=64, osl=5)
        + json.dumps(no_replay)
        + "\n",
    )
    reader = read_trace(path)
    requests = list(reader)
    assert reader.format == "dynamo"
    # times are relative to the earliest arrival, not the first row; order is file order
    assert [r.arrival_s for r in requests] == pytest.approx([2.0, 0.0, 0.9])
    assert [(r.input_length, r.output_length) for r in requests] == [(128, 4), (64, 5), (42, 3)]
    assert requests[0].hash_ids == (7,)
    assert requests[2].hash_ids is None


# --- files, globs, directories, gzip -----------------------------------------------------------


def test_gzip_file_reads_like_the_plain_one(mooncake_head: Path, tmp_path: Path) -> None:
    packed = tmp_path / "trace.jsonl.gz"
    with gzip.open(packed, "wb") as out:
        out.write(mooncake_head.read_bytes())
    assert list(read_trace(packed)) == list(read_trace(mooncake_head))


def test_directory_of_shards_in_name_order(mooncake_head: Path, tmp_path: Path) -> None:
    lines = mooncake_head.read_text().splitlines(keepends=True)
    write(tmp_path / "part-000.jsonl", "".join(lines[:120]))
    with gzip.open(tmp_path / "part-001.jsonl.gz", "wt") as out:
        out.write("".join(lines[120:]))
    write(tmp_path / "README.txt", "not a trace\n")
    reader = read_trace(tmp_path)
    assert [p.name for p in reader.files] == ["part-000.jsonl", "part-001.jsonl.gz"]
    assert list(reader) == list(read_trace(mooncake_head))
    globbed = read_trace(str(tmp_path / "part-*"))
    assert len(list(globbed)) == 300


def test_compressed_and_plain_copy_of_one_shard_is_an_error(
    mooncake_head: Path, tmp_path: Path
) -> None:
    shutil.copy(mooncake_head, tmp_path / "a.jsonl")
    with gzip.open(tmp_path / "a.jsonl.gz", "wb") as out:
        out.write(mooncake_head.read_bytes())
    with pytest.raises(TraceError, match=r"both a\.jsonl\.gz and a\.jsonl"):
        read_trace(tmp_path)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("missing.jsonl", "no such file or directory"),
        ("nothing-*.csv", "no file matches this pattern"),
    ],
)
def test_missing_inputs_name_the_path(tmp_path: Path, name: str, expected: str) -> None:
    with pytest.raises(TraceError, match=expected) as info:
        read_trace(tmp_path / name)
    assert str(tmp_path / name) in str(info.value)


def test_empty_directory_and_mixed_formats(
    azure_head: Path, mooncake_head: Path, tmp_path: Path
) -> None:
    with pytest.raises(TraceError, match="no trace files in this directory"):
        read_trace(tmp_path)
    shutil.copy(mooncake_head, tmp_path / "a.jsonl")
    shutil.copy(azure_head, tmp_path / "b.csv")
    with pytest.raises(TraceError, match=r"different formats.*mooncake \(a\.jsonl\)"):
        read_trace(tmp_path)


def test_unknown_format_and_explicit_format(azure_head: Path, tmp_path: Path) -> None:
    path = write(tmp_path / "t.csv", "when,prompt,completion\n1,2,3\n")
    with pytest.raises(TraceError, match=r"t\.csv:1: cannot tell the trace format"):
        read_trace(path)
    with pytest.raises(TraceError, match=r"t\.csv:1: missing column\(s\) TIMESTAMP"):
        list(read_trace(path, trace_format="azure"))
    with pytest.raises(TraceError, match="trace format 'splitwise' is not known"):
        read_trace(azure_head, trace_format="splitwise")
    assert len(list(read_trace(azure_head, trace_format="azure"))) == 300


# --- bad rows ----------------------------------------------------------------------------------

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
GOOD_AZURE = "2023-11-16 18:15:46.6805900,374,44\r\n"
GOOD_MOONCAKE = '{"timestamp": 0, "input_length": 10, "output_length": 2}\n'

BAD_ROWS = [
    # (file name, text, bad line, words the message must contain)
    ("a.csv", AZURE_HEADER + GOOD_AZURE + "2023-11-16 18:15:47.1,abc,3\r\n", 3, "ContextTokens"),
    ("a.csv", AZURE_HEADER + GOOD_AZURE + "16/11/2023 18:15,10,3\r\n", 3, "TIMESTAMP"),
    ("a.csv", AZURE_HEADER + GOOD_AZURE + "2023-11-16 18:15:47.1,10\r\n", 3, "column"),
    ("a.csv", AZURE_HEADER + GOOD_AZURE + "2023-11-16 18:15:40.0,10,3\r\n", 3, "sorted by time"),
    ("m.jsonl", GOOD_MOONCAKE + '{"timestamp": 5, "input_length": 1\n', 2, "not valid JSON"),
    ("m.jsonl", GOOD_MOONCAKE + '{"timestamp": 5, "input_length": 1}\n', 2, "output_length"),
    (
        "m.jsonl",
        GOOD_MOONCAKE + '{"timestamp": 5, "input_length": -3, "output_length": 1}\n',
        2,
        "input_length = -3",
    ),
    (
        "m.jsonl",
        GOOD_MOONCAKE + '{"timestamp": "soon", "input_length": 3, "output_length": 1}\n',
        2,
        "timestamp",
    ),
    (
        "b.csv",
        BURSTGPT_HEADER + "5,ChatGPT,47,18,65,x\n" + "later,ChatGPT,47,18,65,x\n",
        3,
        "Timestamp",
    ),
    ("d.jsonl", dynamo_end(1000) + '{"schema": "dynamo.request.trace.v2"}\n', 2, "schema"),
    (
        "d.jsonl",
        dynamo_end(1000) + dynamo_end(2000).replace('"output_tokens": 10, ', ""),
        2,
        "output_tokens",
    ),
]


@pytest.mark.parametrize(("name", "text", "line", "words"), BAD_ROWS)
def test_bad_row_names_file_and_line(
    tmp_path: Path, name: str, text: str, line: int, words: str
) -> None:
    path = write(tmp_path / name, text)
    with pytest.raises(TraceError) as info:
        list(read_trace(path))
    assert str(info.value).startswith(f"{path}:{line}: ")
    assert words in str(info.value)
    assert (info.value.path, info.value.line) == (str(path), line)


@pytest.mark.parametrize(("name", "text", "line", "words"), BAD_ROWS)
def test_skip_bad_rows_counts_them(
    tmp_path: Path, name: str, text: str, line: int, words: str
) -> None:
    path = write(tmp_path / name, text + text.splitlines(keepends=True)[-2])
    reader = read_trace(path, skip_bad_rows=True)
    requests = list(reader)
    assert reader.bad_rows == 1
    assert len(requests) == reader.requests == 2
    assert reader.bad_examples[0].startswith(f"{path}:{line}: ")


def test_reading_streams_rows_before_a_later_bad_one(tmp_path: Path) -> None:
    path = write(tmp_path / "m.jsonl", GOOD_MOONCAKE * 2 + "garbage\n")
    reader = read_trace(path)
    assert next(reader).input_length == 10
    assert next(reader).input_length == 10
    with pytest.raises(TraceError, match=r"m\.jsonl:3: not valid JSON"):
        next(reader)


# --- bucketing -------------------------------------------------------------------------------


def req(t: float, isl: int, osl: int) -> TraceRequest:
    return TraceRequest(arrival_s=t, input_length=isl, output_length=osl)


def test_bucket_counts_means_and_empty_intervals() -> None:
    requests = [req(0.5, 100, 10), req(9.99, 300, 30), req(25.0, 1000, 5), req(10.0, 50, 1)]
    out = bucket_trace(requests, interval_s=10, isl_bounds=[100, 500], osl_bounds=[10])
    assert [iv.start_s for iv in out] == [0.0, 10.0, 20.0]
    assert [iv.num_req for iv in out] == [2, 1, 1]
    assert out[0].mean_isl == 200 and out[0].mean_osl == 20
    # bins (-inf,100) [100,500) [500,inf): a value on a bound goes to the upper bin
    assert out[0].isl_counts == (0, 2, 0)
    assert out[0].osl_counts == (0, 2)
    assert out[2].isl_counts == (0, 0, 1)

    gap = bucket_trace([req(0, 10, 1), req(35, 20, 2)], interval_s=10)
    assert [iv.num_req for iv in gap] == [1, 0, 0, 1]
    assert gap[1].mean_isl is None and gap[1].mean_osl is None
    assert sum(gap[1].isl_counts) == 0
    assert bucket_trace([], interval_s=10) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"interval_s": 0}, "interval_s = 0"),
        ({"interval_s": 10, "isl_bounds": [10, 5]}, r"isl_bounds\[1\] = 5"),
        ({"interval_s": 10, "osl_bounds": [float("nan")]}, r"osl_bounds\[0\]"),
    ],
)
def test_bucket_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        bucket_trace([req(0, 1, 1)], **kwargs)


def test_bucket_rejects_negative_arrival() -> None:
    with pytest.raises(ValueError, match=r"requests\[1\]\.arrival_s = -1"):
        bucket_trace([req(0, 1, 1), req(-1, 1, 1)], interval_s=5)
