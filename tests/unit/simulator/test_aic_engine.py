"""The AIConfigurator engine model (``aic:`` specs): parsing, refusals before any network
access, plausible answers against published points, KV capacity from its memory model, the
extrapolation guard, the interface the simulator relies on, and a replay end to end.

These tests need the extra ``disagg-planner[aic]`` (``.ci/run`` installs it)."""

from __future__ import annotations

import inspect
import json
import logging
import socket
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from disagg_planner.cli.main import main
from disagg_planner.simulator import aic_engine
from disagg_planner.simulator.aic_engine import AicEngineModel
from disagg_planner.simulator.aic_tables import INSTALL_HINT
from disagg_planner.simulator.calibration import POINTS
from disagg_planner.simulator.engine_model import EngineModel
from disagg_planner.simulator.engine_spec import parse
from disagg_planner.simulator.engines import engine_for
from disagg_planner.simulator.errors import EngineSpecError

H200_8B_FP8 = "aic:llama-3.1-8b-fp8@h200_sxm:tp1"


@pytest.fixture(scope="module")
def h200_8b() -> EngineModel:
    return engine_for(H200_8B_FP8)


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """A tripwire: every attempt to open a connection is recorded and refused."""
    attempts: list[object] = []
    mine = threading.get_ident()

    def refuse(self: socket.socket, address: object) -> None:
        # only this test's thread: background threads of earlier tests (watchers retrying a
        # stopped loopback server) are not the engine's doing
        if threading.get_ident() == mine:
            attempts.append(address)
        raise OSError(f"test: no network ({address!r})")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


@pytest.mark.aic
def test_an_aic_spec_names_a_shipped_config_and_round_trips() -> None:
    spec = parse("aic:llama-3.1-8b-fp8@h200_sxm:trtllm:tp1")
    assert spec.timing == "aic" and spec.backend == "trtllm"
    assert spec.aic_model == "meta-llama/Meta-Llama-3.1-8B"
    assert spec.model.weight_dtype == "fp8" and spec.model.kv_dtype == "fp8"
    assert parse(str(spec)) == spec
    by_hub_id = parse("aic:nvidia/Llama-3.1-70B-Instruct-FP8@h200_sxm:tp1")
    assert by_hub_id.model.name == "llama-3.3-70b-fp8" and by_hub_id.backend == "vllm"
    assert parse(str(by_hub_id)) == by_hub_id
    # Scheduler options of the sim: grammar apply to the simulated scheduler as before.
    assert parse("aic:llama-3.1-8b@h100_sxm:sglang:tp2:seqs=512").max_num_seqs == 512


@pytest.mark.aic
def test_the_engine_model_of_an_aic_spec_is_the_aic_one(h200_8b: EngineModel) -> None:
    assert isinstance(h200_8b, AicEngineModel)
    assert type(engine_for("sim:llama-3.1-8b-fp8@h200_sxm:tp1")) is EngineModel
    sim = engine_for("sim:llama-3.1-8b-fp8@h200_sxm:tp1")
    assert h200_8b.decode_step_time_s(64, 3000) != sim.decode_step_time_s(64, 3000)


def test_the_roofline_refuses_an_aic_spec_instead_of_timing_it_silently() -> None:
    with pytest.raises(EngineSpecError, match="engine_for"):
        EngineModel(H200_8B_FP8)


@pytest.mark.aic
def test_a_model_it_would_fetch_from_the_hub_is_refused_before_any_network(
    no_network: list[object],
) -> None:
    with pytest.raises(EngineSpecError, match="model hub, which the planner never does"):
        parse("aic:someorg/some-model@h200_sxm:tp1")
    with pytest.raises(EngineSpecError, match="lacks its architecture"):
        parse("aic:Qwen/Qwen3-8B@h200_sxm:tp1")
    with pytest.raises(EngineSpecError, match="no AIConfigurator config is mapped"):
        parse("aic:deepseek-v3@h200_sxm:tp8")
    assert no_network == []


@pytest.mark.aic
def test_the_library_itself_cannot_reach_the_hub(
    h200_8b: EngineModel, no_network: list[object]
) -> None:
    # Building an aic engine installs the guard inside aiconfigurator-core: a model name it
    # does not ship goes to its download function, which now refuses without connecting.
    from aiconfigurator_core.sdk import utils

    with pytest.raises(EngineSpecError, match="never reaches the network"):
        utils._load_model_config_from_model_path("someorg/some-model")
    assert no_network == []


@pytest.mark.aic
def test_unknown_gpus_and_unsupported_settings_are_refused() -> None:
    with pytest.raises(EngineSpecError, match="unknown GPU"):
        parse("aic:llama-3.1-8b@mi300x:tp1")
    with pytest.raises(EngineSpecError, match="no FP8 tensor cores"):
        parse("aic:llama-3.1-8b-fp8@a100_sxm:tp1")
    with pytest.raises(EngineSpecError, match=r"neither a backend \(vllm\|sglang\|trtllm\)"):
        parse("aic:llama-3.1-8b@h200_sxm:tensorrt")


def test_without_the_extra_an_aic_spec_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A None entry in sys.modules makes the package unimportable, as when it is absent.
    monkeypatch.setitem(sys.modules, "aiconfigurator_core", None)
    with pytest.raises(EngineSpecError) as refused:
        parse(H200_8B_FP8)
    assert INSTALL_HINT in str(refused.value) and "\n" not in str(refused.value)
    # The sim engine does not need it.
    assert parse("sim:llama-3.1-8b-fp8@h200_sxm:tp1").timing == "sim"
    tiny = ["--engine", H200_8B_FP8, "--workload", "poisson:rate=2,isl=500,osl=20,duration=30"]
    code = main(["replay", "-o", str(tmp_path / "o"), "--no-progress", *tiny])
    err = capsys.readouterr().err.strip()
    assert code == 2
    # One line says it all (an INFO log line about the GPU budget may come before it).
    (line,) = [line for line in err.splitlines() if "aiconfigurator-core" in line]
    assert line.endswith(
        f"the aic engine needs aiconfigurator-core, which is not installed: {INSTALL_HINT}"
    )


@pytest.mark.slow
@pytest.mark.aic
@pytest.mark.parametrize(
    "point",
    [p for p in POINTS if p.kind in ("decode_step", "prefill_thpt", "decode_thpt_at_itl")],
    ids=lambda p: p.name,
)
def test_the_aic_engine_answers_plausibly_against_published_points(point) -> None:
    # Uncalibrated measured tables: within 40% of every published latency/throughput point
    # (engine-calibration.md 6.3 reports -46% to +62% for the bare library on its points).
    assert abs(point.error("aic")) <= 0.40, (point.model_value("aic"), point.target)
    assert not point.extrapolated("aic")


@pytest.mark.slow
@pytest.mark.aic
def test_trtllm_tables_reproduce_a_published_trtllm_row() -> None:
    (row,) = [
        p
        for p in POINTS
        if p.name.startswith("H200 8B-FP8 TP1 offline output") and "2048/128" in p.name
    ]
    assert row.backend == "trtllm"
    assert abs(row.error("aic")) <= 0.15, row.model_value("aic")


@pytest.mark.aic
def test_kv_capacity_comes_from_its_memory_model(h200_8b: EngineModel) -> None:
    from aiconfigurator_core.sdk.memory import estimate_num_gpu_blocks

    expected = estimate_num_gpu_blocks(
        "meta-llama/Meta-Llama-3.1-8B",
        "h200_sxm",
        "vllm",
        "0.24.0",
        scheduler_block_size=16,
        max_num_tokens=8192,
        max_batch_size=256,
        memory_fraction_kind="of_total",
        memory_fraction_value=0.9,
        gemm_quant_mode="fp8",
        kvcache_quant_mode="fp8",
    )
    assert h200_8b.kv_blocks == expected
    assert h200_8b.kv_blocks != engine_for("sim:llama-3.1-8b-fp8@h200_sxm:tp1").kv_blocks
    assert h200_8b.capabilities.total_kv_blocks == expected
    assert h200_8b.max_kv_tokens == expected * 16
    smaller = engine_for(H200_8B_FP8 + ":mem=0.5")
    assert 0 < smaller.kv_blocks < h200_8b.kv_blocks
    bf16_kv = engine_for(H200_8B_FP8 + ":kv=bf16")
    assert bf16_kv.kv_blocks < h200_8b.kv_blocks * 0.6


@pytest.mark.aic
def test_answers_outside_the_measured_grid_are_flagged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = engine_for(H200_8B_FP8 + ":max_model_len=100000")
    assert isinstance(model, AicEngineModel)
    assert model.grid.prefill_sequence == 16384
    assert model.outside_grid(3000, 0, 0, 0) == []
    model.prefill_time_s(3000)
    assert not model.extrapolations
    with caplog.at_level(logging.WARNING, logger=aic_engine.__name__):
        model.prefill_time_s(65536)
        model.prefill_time_s(40000)
    assert model.extrapolations["prefill sequence"] > 1
    notes = model.outside_grid(8192, 60000, 0, 0)
    assert notes and "prefill sequence 68192 > measured 16384" in notes[0]
    logged = [r for r in caplog.records if "outside its measured grid" in r.getMessage()]
    assert len(logged) == 1  # once per kind, then counted
    assert model.outside_grid(0, 0, 4096, 4096 * 100) == ["decode batch 4096 > measured 2048"]


@pytest.mark.aic
def test_vectorised_bulk_and_scalar_timings_agree(h200_8b: EngineModel) -> None:
    kv = 8 * 800 + 8 * np.arange(5, dtype=np.float64)
    as_array = h200_8b.iteration_time_s(0, 0, 8, kv)
    as_scalars = [h200_8b.iteration_time_s(0, 0, 8, float(k)) for k in kv]
    assert as_array.tolist() == as_scalars == h200_8b.decode_run_s(8, 8 * 800, 5)
    # More work never takes less time.
    assert h200_8b.decode_step_time_s(128, 3000) > h200_8b.decode_step_time_s(8, 3000)
    assert h200_8b.decode_step_time_s(64, 8000) > h200_8b.decode_step_time_s(64, 1000)
    assert h200_8b.iteration_time_s(2048, 8192, 0, 0) > h200_8b.iteration_time_s(2048, 0, 0, 0)
    mixed = h200_8b.iteration_time_s(1024, 0, 32, 32 * 2000)
    assert mixed > h200_8b.iteration_time_s(1024, 0, 0, 0)
    assert mixed > h200_8b.iteration_time_s(0, 0, 32, 32 * 2000)
    # Several prefills with the exact attention pairs: the same as equal chunks when equal.
    pairs = 2 * 512 * (1000 + 513 / 2)
    assert h200_8b.iteration_time_s(
        1024, 2000, 0, 0, prefill_requests=2, prefill_attention_pairs=pairs
    ) == pytest.approx(h200_8b.iteration_time_s(1024, 2000, 0, 0, prefill_requests=2))


def test_every_timing_entry_point_of_the_engine_model_is_the_aic_one() -> None:
    # The simulator may only reach timings through the two public methods that call the
    # timing hooks the aic model overrides (and apply the spec's speed), or through ones
    # built on those; a new timing method of EngineModel must be added here (and built on
    # the hooks) or the aic engine would silently time with the roofline.
    hooks = {"_iteration_s", "_decode_run_s"}
    on_hooks = {"iteration_time_s", "decode_run_s"}
    built_on_those = {"prefill_time_s", "decode_step_time_s", "max_decode_batch"}
    public = {
        name
        for name, member in vars(EngineModel).items()
        if not name.startswith("_") and inspect.isfunction(member)
    }
    assert public - on_hooks - built_on_those == set()
    assert hooks <= set(vars(AicEngineModel))
    # overriding a public one would skip the speed multiple
    assert public & set(vars(AicEngineModel)) == set()


@pytest.mark.slow
@pytest.mark.aic
def test_planner_replay_runs_on_the_aic_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o"
    run = ["--engine", H200_8B_FP8, "--workload", "poisson:rate=4,isl=1000,osl=50,duration=60"]
    code = main(
        ["replay", "-o", str(out), "--no-progress", "--json", "--policy", "static:1,1", *run]
    )
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["engine"] == str(parse(H200_8B_FP8))
    lines = (out / "requests.csv").read_text().splitlines()
    assert len(lines) - 1 == summary["requests"] > 100


@pytest.mark.aic
@pytest.mark.parametrize("steps", [3, 64, 65, 700])
@pytest.mark.parametrize(("batch", "kv"), [(1, 5), (7, 7 * 127), (64, 64 * 3000 + 17)])
def test_decode_runs_short_and_long_are_the_per_step_timings(
    h200_8b: EngineModel, steps: int, batch: int, kv: int
) -> None:
    per_step = [h200_8b.iteration_time_s(0, 0, batch, kv + batch * i) for i in range(steps)]
    assert h200_8b.decode_run_s(batch, kv, steps) == per_step


def test_cache_buckets_are_close_and_their_segments_exact() -> None:
    from disagg_planner.simulator.aic_engine import _bucket_end, _bucket_int

    n = 0
    while n < 300_000:
        end = _bucket_end(n)
        key = _bucket_int(n)
        assert end >= n and abs(key - n) <= max(0.008 * n, 1)
        assert all(_bucket_int(m) == key for m in range(n, end + 1))
        assert _bucket_int(end + 1) != key or (end + 1).bit_length() != end.bit_length()
        n = end + 1


@pytest.mark.slow
@pytest.mark.aic
def test_a_profile_swept_from_the_aic_engine_replays_on_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "profile"
    sweep = ["--granularity-prefill", "3", "--granularity-decode", "2"]
    sweep += ["--granularity-concurrency", "3", "--max-context-length", "4096"]
    assert main(["profile", "--engine", H200_8B_FP8, "-o", str(profile), *sweep]) == 0
    assert "engine_spec: aic:llama-3.1-8b-fp8@h200_sxm:vllm:tp1" in (
        (profile / "profile.yaml").read_text()
    )
    out = tmp_path / "replay"
    tiny = ["--workload", "poisson:rate=2,isl=500,osl=20,duration=30", "--policy", "static:1,1"]
    assert main(["replay", "-o", str(out), "--no-progress", "--profile", str(profile), *tiny]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["engine"] == str(parse(H200_8B_FP8))


@pytest.mark.slow
@pytest.mark.aic
def test_building_and_timing_an_engine_opens_no_connection(no_network: list[object]) -> None:
    # A spec no other test compiles: its config, tables and memory model all load offline.
    model = engine_for("aic:Qwen/Qwen3-32B-FP8@h100_sxm:sglang:tp2")
    assert isinstance(model, AicEngineModel) and model.kv_blocks > 0
    assert 0 < model.decode_step_time_s(16, 2000) < model.prefill_time_s(4000)
    assert no_network == []
