"""Reading Dynamo's layout (NPZ and JSON), the manifest, the writer, and every malformed case."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml

from disagg_planner.profiles import ProfileError, ProfileManifest, load_profile, write_profile
from disagg_planner.profiles.manifest import EngineShape, load_manifest
from tests.unit.profiles.engine_model import Engine, write_dynamo_layout

ENGINE = Engine()
PREFILL_NPZ = "selected_prefill_interpolation/raw_data.npz"
DECODE_NPZ = "selected_decode_interpolation/raw_data.npz"


def test_reads_a_profile_in_exactly_dynamos_layout(tmp_path: Path) -> None:
    arrays = ENGINE.arrays()
    write_dynamo_layout(tmp_path, arrays)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.npz")) == [
        DECODE_NPZ,
        PREFILL_NPZ,
    ]
    profile = load_profile(tmp_path)
    assert profile.manifest is None
    assert profile.source_dir == tmp_path
    assert profile.max_kv_tokens == 200_000
    assert profile.prefill.isl_range == (100.0, 16000.0)
    assert profile.decode.context_range == (512.0, 16384.0)
    # Samples come back unchanged, in order.
    np.testing.assert_array_equal(profile.prefill.data.ttft_ms, arrays["prefill_ttft"])
    np.testing.assert_array_equal(profile.decode.data.itl_ms, arrays["z_itl"])
    # Dynamo's worked example in spirit: ~36k tokens/s/GPU at ISL 3000, TTFT ~83 ms.
    assert profile.prefill.ttft_ms(3000) == pytest.approx(83.0, rel=0.005)


def test_integer_isl_and_scalar_max_kv_tokens_are_accepted(tmp_path: Path) -> None:
    arrays = ENGINE.arrays()
    arrays["prefill_isl"] = arrays["prefill_isl"].astype(np.int64)
    arrays["max_kv_tokens"] = np.array(200_000.0)  # 0-d, integral float
    write_dynamo_layout(tmp_path, arrays)
    profile = load_profile(tmp_path)
    assert profile.max_kv_tokens == 200_000
    assert profile.prefill.data.isl.dtype == np.float64


def test_json_fallback_is_read_when_there_is_no_npz(tmp_path: Path) -> None:
    arrays = ENGINE.arrays()
    write_profile(
        tmp_path,
        prefill_isl=arrays["prefill_isl"],
        prefill_ttft_ms=arrays["prefill_ttft"],
        prefill_thpt_per_gpu=arrays["prefill_thpt_per_gpu"],
        decode_kv_usage=arrays["x_kv_usage"],
        decode_context_length=arrays["y_context_length"],
        decode_itl_ms=arrays["z_itl"],
        decode_thpt_per_gpu=arrays["z_thpt_per_gpu"],
        max_kv_tokens=200_000,
        file_format="json",
    )
    decode_json = json.loads(
        (tmp_path / "selected_decode_interpolation/decode_raw_data.json").read_text()
    )
    assert decode_json["max_kv_tokens"] == 200_000  # an int, as in Dynamo's ConfigMap
    assert not list(tmp_path.rglob("*.npz"))
    profile = load_profile(tmp_path)
    np.testing.assert_allclose(profile.decode.data.thpt_per_gpu, arrays["z_thpt_per_gpu"])


def test_npz_wins_over_json(tmp_path: Path) -> None:
    arrays = ENGINE.arrays()
    write_dynamo_layout(tmp_path, arrays)
    (tmp_path / "selected_prefill_interpolation/prefill_raw_data.json").write_text("not json")
    assert load_profile(tmp_path).prefill.isl_range == (100.0, 16000.0)


def test_writer_round_trips_with_manifest(tmp_path: Path) -> None:
    arrays = ENGINE.arrays()
    manifest = ProfileManifest(
        model="meta-llama/Llama-3.1-8B-Instruct-FP8",
        gpu="h200_sxm",
        backend="vllm",
        backend_version="0.10.1.1",
        source="modelled",
        tool="planner profile --engine sim:h200",
        date="2025-06-01",
        kv_block_size=128,
        engine=EngineShape(tp=1, max_num_seqs=256, max_num_batched_tokens=8192),
        prefill_engine=EngineShape(tp=2, max_num_seqs=256, max_num_batched_tokens=8192),
        decode_engine=EngineShape(tp=1, max_num_seqs=256, max_num_batched_tokens=8192),
    )
    write_profile(
        tmp_path,
        prefill_isl=arrays["prefill_isl"],
        prefill_ttft_ms=arrays["prefill_ttft"],
        prefill_thpt_per_gpu=arrays["prefill_thpt_per_gpu"],
        decode_kv_usage=arrays["x_kv_usage"],
        decode_context_length=arrays["y_context_length"],
        decode_itl_ms=arrays["z_itl"],
        decode_thpt_per_gpu=arrays["z_thpt_per_gpu"],
        max_kv_tokens=200_000,
        manifest=manifest,
    )
    with np.load(tmp_path / DECODE_NPZ) as npz:
        assert sorted(npz.files) == sorted(
            ["x_kv_usage", "y_context_length", "z_itl", "z_thpt_per_gpu", "max_kv_tokens"]
        )
        assert npz["max_kv_tokens"].shape == (1,)
    with np.load(tmp_path / PREFILL_NPZ) as npz:
        assert sorted(npz.files) == ["prefill_isl", "prefill_thpt_per_gpu", "prefill_ttft"]
    stored = yaml.safe_load((tmp_path / "profile.yaml").read_text())
    assert stored["prefill"] == {"tp": 2}  # only what differs from the shared shape
    assert "decode" not in stored
    profile = load_profile(tmp_path)
    assert profile.manifest == manifest
    assert profile.manifest.prefill_engine.gpus == 2
    assert profile.manifest.summary() == (
        "meta-llama/Llama-3.1-8B-Instruct-FP8 on h200_sxm, vllm 0.10.1.1, "
        "prefill tp2, decode tp1, modelled, 2025-06-01"
    )


def test_manifest_keeps_unknown_keys_and_reads_yaml_dates(tmp_path: Path) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text(
        "model: m\ngpu: g\nbackend: sglang\nsource: measured\ndate: 2025-01-31\n"
        "tp: 4\ndp: 2\ncalibration: {mfu: 0.4}\n"
    )
    manifest = load_manifest(path)
    assert manifest.date == "2025-01-31"
    assert manifest.decode_engine.gpus == 8  # tp * dp when gpus_per_engine is not given
    assert manifest.extra == {"calibration": {"mfu": 0.4}}


def test_writer_refuses_invalid_data_naming_the_target_file(tmp_path: Path) -> None:
    arrays = ENGINE.arrays()
    with pytest.raises(ProfileError) as info:
        write_profile(
            tmp_path,
            prefill_isl=arrays["prefill_isl"],
            prefill_ttft_ms=arrays["prefill_ttft"],
            prefill_thpt_per_gpu=-arrays["prefill_thpt_per_gpu"],
            decode_kv_usage=arrays["x_kv_usage"],
            decode_context_length=arrays["y_context_length"],
            decode_itl_ms=arrays["z_itl"],
            decode_thpt_per_gpu=arrays["z_thpt_per_gpu"],
            max_kv_tokens=200_000,
        )
    assert str(info.value) == (
        f"{tmp_path / PREFILL_NPZ}: prefill_thpt_per_gpu[0] = "
        f"{-float(arrays['prefill_thpt_per_gpu'][0])!r}: must be positive"
    )
    assert not (tmp_path / "selected_prefill_interpolation").exists()


# --- malformed profiles: one row per case, each must name file, key, index and value -------

Mutation = Callable[[dict[str, np.ndarray]], None]


def _set(key: str, index: int, value: float) -> Mutation:
    def mutate(arrays: dict[str, np.ndarray]) -> None:
        arr = arrays[key].astype(np.float64)
        arr[index] = value
        arrays[key] = arr

    return mutate


def _replace(key: str, value: object) -> Mutation:
    def mutate(arrays: dict[str, np.ndarray]) -> None:
        arrays[key] = value  # type: ignore[assignment]

    return mutate


def _drop(key: str) -> Mutation:
    def mutate(arrays: dict[str, np.ndarray]) -> None:
        del arrays[key]

    return mutate


def _decode_points(kv: list[float], ctx: list[float]) -> Mutation:
    def mutate(arrays: dict[str, np.ndarray]) -> None:
        n = len(kv)
        arrays["x_kv_usage"] = np.array(kv)
        arrays["y_context_length"] = np.array(ctx)
        arrays["z_itl"] = np.linspace(10, 20, n)
        arrays["z_thpt_per_gpu"] = np.linspace(100, 200, n)

    return mutate


MALFORMED: list[tuple[str, Mutation, str, str]] = [
    (
        "missing key",
        _drop("prefill_ttft"),
        PREFILL_NPZ,
        "prefill_ttft: missing key (the file has prefill_isl, prefill_thpt_per_gpu)",
    ),
    ("missing max_kv_tokens", _drop("max_kv_tokens"), DECODE_NPZ, "max_kv_tokens: missing key"),
    (
        "lengths differ",
        _replace("prefill_thpt_per_gpu", np.array([1.0, 2.0, 3.0])),
        PREFILL_NPZ,
        "prefill_thpt_per_gpu: has 3 values but prefill_isl has 7; the arrays must have equal "
        "length",
    ),
    (
        "decode lengths differ",
        _replace("z_itl", np.ones(3)),
        DECODE_NPZ,
        "z_itl: has 3 values but x_kv_usage has",
    ),
    (
        "NaN latency",
        _set("prefill_ttft", 3, np.nan),
        PREFILL_NPZ,
        "prefill_ttft[3] = nan: must be a finite number",
    ),
    (
        "inf throughput",
        _set("z_thpt_per_gpu", 5, np.inf),
        DECODE_NPZ,
        "z_thpt_per_gpu[5] = inf: must be a finite number",
    ),
    (
        "zero throughput",
        _set("prefill_thpt_per_gpu", 2, 0.0),
        PREFILL_NPZ,
        "prefill_thpt_per_gpu[2] = 0.0: must be positive",
    ),
    ("negative latency", _set("z_itl", 4, -1.5), DECODE_NPZ, "z_itl[4] = -1.5: must be positive"),
    (
        "duplicate ISL",
        _set("prefill_isl", 2, 500.0),
        PREFILL_NPZ,
        "prefill_isl[2] = 500.0: duplicate ISL point (equal to prefill_isl[1])",
    ),
    (
        "unsorted ISL",
        _set("prefill_isl", 3, 700.0),
        PREFILL_NPZ,
        "prefill_isl[3] = 700.0: ISL points must be strictly increasing (prefill_isl[2] = 1000.0)",
    ),
    (
        "too few prefill points",
        lambda a: a.update(
            prefill_isl=np.array([100.0]),
            prefill_ttft=np.array([5.0]),
            prefill_thpt_per_gpu=np.array([1e4]),
        ),
        PREFILL_NPZ,
        "prefill_isl: has 1 point(s); at least 2 are needed",
    ),
    (
        "too few decode points",
        _decode_points([0.1, 0.2], [100.0, 200.0]),
        DECODE_NPZ,
        "x_kv_usage: has 2 point(s); at least 3 are needed",
    ),
    (
        "KV usage above 1",
        _set("x_kv_usage", 1, 1.25),
        DECODE_NPZ,
        "x_kv_usage[1] = 1.25: must be a fraction between 0 and 1",
    ),
    (
        "duplicate decode point",
        _decode_points([0.1, 0.2, 0.1, 0.3], [100.0, 100.0, 100.0, 200.0]),
        DECODE_NPZ,
        "duplicate decode point: (x_kv_usage, y_context_length) at index 2 repeats index 0",
    ),
    (
        "one context length only",
        _decode_points([0.1, 0.2, 0.3], [100.0, 100.0, 100.0]),
        DECODE_NPZ,
        "y_context_length: all points share the value 100.0",
    ),
    (
        "collinear decode points",
        # (on one line in the interpolator's coordinates: KV usage and log context)
        _decode_points([0.1, 0.2, 0.3], [100.0, 200.0, 400.0]),
        DECODE_NPZ,
        "y_context_length: the decode points lie on one line",
    ),
    (
        "max_kv_tokens not an integer",
        _replace("max_kv_tokens", np.array([1234.5])),
        DECODE_NPZ,
        "max_kv_tokens[0] = 1234.5: must be a positive integer",
    ),
    (
        "max_kv_tokens zero",
        _replace("max_kv_tokens", np.array([0])),
        DECODE_NPZ,
        "max_kv_tokens[0] = 0: must be a positive integer",
    ),
    (
        "max_kv_tokens two values",
        _replace("max_kv_tokens", np.array([1, 2])),
        DECODE_NPZ,
        "max_kv_tokens: must hold exactly one value, got shape (2,)",
    ),
    (
        "2-D array",
        _replace("prefill_isl", np.ones((7, 1))),
        PREFILL_NPZ,
        "prefill_isl: must be a 1-D array, got shape (7, 1)",
    ),
    (
        "strings",
        _replace("z_itl", np.array(["a", "b"])),
        DECODE_NPZ,
        "z_itl: must hold numbers, got an array of dtype <U1",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "file", "expected"),
    [pytest.param(m, f, e, id=name) for name, m, f, e in MALFORMED],
)
def test_malformed_profile_names_file_key_index_and_value(
    tmp_path: Path, mutate: Mutation, file: str, expected: str
) -> None:
    arrays = ENGINE.arrays()
    mutate(arrays)
    write_dynamo_layout(tmp_path, arrays)
    with pytest.raises(ProfileError) as info:
        load_profile(tmp_path)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / file}: "), message
    assert expected in message
    assert isinstance(info.value, ValueError)


def test_missing_files_name_both_npz_and_json(tmp_path: Path) -> None:
    write_dynamo_layout(tmp_path, ENGINE.arrays())
    (tmp_path / DECODE_NPZ).unlink()
    with pytest.raises(ProfileError) as info:
        load_profile(tmp_path)
    folder = tmp_path / "selected_decode_interpolation"
    assert f"neither {folder / 'raw_data.npz'} nor {folder / 'decode_raw_data.json'} exists" in (
        str(info.value)
    )
    assert "profiles/bundled/README.md" in str(info.value)


def test_missing_directory_and_file_instead_of_directory(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="does not exist"):
        load_profile(tmp_path / "nope")
    (tmp_path / "f").write_text("")
    with pytest.raises(ProfileError, match="is not a directory"):
        load_profile(tmp_path / "f")


def test_random_bytes_npz_says_what_it_is_without_numpys_pickle_advice(tmp_path: Path) -> None:
    write_dynamo_layout(tmp_path, ENGINE.arrays())
    (tmp_path / PREFILL_NPZ).write_bytes(bytes(range(7, 255)))
    with pytest.raises(ProfileError, match="not an NPZ file: expected a zip archive") as info:
        load_profile(tmp_path)
    message = str(info.value)
    assert str(tmp_path / PREFILL_NPZ) in message
    assert "pickle" not in message and "unsafely" not in message


def test_corrupt_npz_and_pickled_object_arrays(tmp_path: Path) -> None:
    write_dynamo_layout(tmp_path, ENGINE.arrays())
    (tmp_path / PREFILL_NPZ).write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ProfileError, match="not a readable NPZ file") as info:
        load_profile(tmp_path)
    assert str(tmp_path / PREFILL_NPZ) in str(info.value)
    arrays = ENGINE.arrays()
    np.savez(
        tmp_path / PREFILL_NPZ,
        prefill_isl=np.array([1, "x"], dtype=object),
        prefill_ttft=arrays["prefill_ttft"],
        prefill_thpt_per_gpu=arrays["prefill_thpt_per_gpu"],
    )
    with pytest.raises(ProfileError, match=r"prefill_isl: cannot be read without pickle"):
        load_profile(tmp_path)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object of arrays, got list"),
        (
            json.dumps(
                {
                    "prefill_isl": [1, 2, "3"],
                    "prefill_ttft": [1, 2, 3],
                    "prefill_thpt_per_gpu": [1, 2, 3],
                }
            ),
            "prefill_isl[2] = '3': must be a number",
        ),
        (
            json.dumps(
                {
                    "prefill_isl": [1, 2, 3],
                    "prefill_ttft": [1, None, 3],
                    "prefill_thpt_per_gpu": [1, 2, 3],
                }
            ),
            "prefill_ttft[1] = None: must be a number",
        ),
        (
            json.dumps({"prefill_isl": [1, 2, 3], "prefill_ttft": [1, 2, 3]}),
            "prefill_thpt_per_gpu: missing key (the file has prefill_isl, prefill_ttft)",
        ),
    ],
)
def test_malformed_json_fallback(tmp_path: Path, content: str, expected: str) -> None:
    write_dynamo_layout(tmp_path, ENGINE.arrays())
    (tmp_path / PREFILL_NPZ).unlink()
    json_file = tmp_path / "selected_prefill_interpolation/prefill_raw_data.json"
    json_file.write_text(content)
    with pytest.raises(ProfileError) as info:
        load_profile(tmp_path)
    assert str(info.value).startswith(f"{json_file}: ")
    assert expected in str(info.value)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("gpu: g\nbackend: b\nsource: measured\n", "model: required key is missing"),
        (
            "model: m\ngpu: g\nbackend: b\nsource: guessed\n",
            "source = 'guessed': must be one of measured, modelled",
        ),
        (
            "model: m\ngpu: g\nbackend: b\nsource: measured\ntp: two\n",
            "tp = 'two': must be a positive integer",
        ),
        (
            "model: m\ngpu: g\nbackend: b\nsource: measured\ndecode: {tp: 0}\n",
            "decode.tp = 0: must be a positive integer",
        ),
        (
            "model: m\ngpu: g\nbackend: b\nsource: measured\nprefill: {tpp: 2}\n",
            "prefill: unknown key(s) tpp",
        ),
        ("- a list\n", "the manifest must be a mapping"),
        ("model: [unclosed\n", "not valid YAML"),
        ("model: m\ngpu: ''\nbackend: b\nsource: measured\n", "gpu: must not be empty"),
    ],
)
def test_malformed_manifest(tmp_path: Path, content: str, expected: str) -> None:
    write_dynamo_layout(tmp_path, ENGINE.arrays())
    (tmp_path / "profile.yaml").write_text(content)
    with pytest.raises(ProfileError) as info:
        load_profile(tmp_path)
    assert str(info.value).startswith(f"{tmp_path / 'profile.yaml'}: ")
    assert expected in str(info.value)
