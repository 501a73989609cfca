"""Config precedence, validation rules, Dynamo compatibility and source attribution."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from disagg_planner.cli.main import main
from disagg_planner.config import PlannerConfig, load_config
from disagg_planner.errors import ConfigError


def problems_of(**kwargs: object) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        load_config(**kwargs)  # type: ignore[arg-type]
    return {p.path: p.rule for p in info.value.problems}


# --- precedence ------------------------------------------------------------------------


def test_file_then_env_then_flag(tmp_path: Path) -> None:
    cfg_file = tmp_path / "planner.yaml"
    cfg_file.write_text("ttft: 100\nitl: 10\nmax_gpu_budget: 16\n")
    env = {"PLANNER_TTFT": "200", "PLANNER_ITL_MS": "20"}
    loaded = load_config(config_arg=str(cfg_file), environ=env, flags={"ttft_ms": "300"})
    assert loaded.config.ttft_ms == 300.0
    assert loaded.config.itl_ms == 20.0
    assert loaded.config.max_gpu_budget == 16
    assert loaded.sources["ttft_ms"].startswith("flag")
    assert loaded.sources["itl_ms"] == "env PLANNER_ITL_MS"
    assert loaded.sources["max_gpu_budget"] == f"file {cfg_file}"
    assert loaded.sources["mode"] == "default"


def test_dynamo_environment_names_and_ours_win(tmp_path: Path) -> None:
    env = {
        "PROMETHEUS_ENDPOINT": "http://prom:9090",
        "DYN_NAMESPACE": "team-a",
        "DYN_PARENT_DGD_K8S_NAME": "llama",
    }
    cfg = load_config(environ=env).config
    assert cfg.metric_pulling_prometheus_endpoint == "http://prom:9090"
    assert cfg.namespace == "team-a"
    assert cfg.dgd_name == "llama"
    env["PLANNER_METRIC_PULLING_PROMETHEUS_ENDPOINT"] = "http://other:9090"
    assert load_config(environ=env).config.metric_pulling_prometheus_endpoint == (
        "http://other:9090"
    )


def test_environment_booleans_and_null() -> None:
    cfg = load_config(
        environ={"PLANNER_NO_CORRECTION": "true", "PLANNER_MODEL_NAME": "null"}
    ).config
    assert cfg.no_correction is True
    assert cfg.model_name is None


# --- Dynamo configs ------------------------------------------------------------------------

DYNAMO_NEW = {
    "environment": "kubernetes",
    "backend": "sglang",
    "mode": "disagg",
    "throughput_adjustment_interval_seconds": 60,
    "ttft_ms": 200.0,
    "itl_ms": 20.0,
    "load_predictor": "kalman",
    "kalman_q_level": 2.0,
    "max_gpu_budget": 16,
    "prefill_min_endpoint": 2,
    "enable_load_scaling": True,
    "load_adjustment_interval_seconds": 10,
    "load_scaling_down_sensitivity": 50,
    "metric_reporting_prometheus_port": 9085,
    "aic_perf_model": {"hf_id": "meta-llama/Llama-3.1-8B"},
    "live_dashboard_port": 8080,
}

DYNAMO_LEGACY = {
    "adjustment_interval": 60,
    "ttft": 200,
    "itl": 20,
    "no_operation": True,
    "enable_loadbased_scaling": True,
    "loadbased_adjustment_interval": 10,
    "loadbased_scaling_down_sensitivity": 50,
    "model_name": "Meta-Llama/Llama-3.1-8B",
}


def test_dynamo_config_with_newest_names_loads(tmp_path: Path) -> None:
    path = tmp_path / "dynamo.json"
    path.write_text(json.dumps(DYNAMO_NEW))
    loaded = load_config(config_arg=str(path))
    cfg = loaded.config
    assert (cfg.backend, cfg.load_predictor, cfg.kalman_q_level) == ("sglang", "kalman", 2.0)
    assert cfg.throughput_adjustment_interval_seconds == 60
    assert cfg.prefill_min_endpoint == 2
    assert cfg.load_scaling_active and cfg.throughput_scaling_active
    assert loaded.ignored_keys == ["aic_perf_model", "live_dashboard_port"]


def test_dynamo_config_with_legacy_names_loads_inline() -> None:
    cfg = load_config(config_arg=json.dumps(DYNAMO_LEGACY)).config
    assert cfg.throughput_adjustment_interval_seconds == 60
    assert (cfg.ttft_ms, cfg.itl_ms) == (200.0, 20.0)
    assert cfg.advisory is True
    assert cfg.enable_load_scaling is True
    assert cfg.load_adjustment_interval_seconds == 10
    assert cfg.load_scaling_down_sensitivity == 50
    assert cfg.model_name == "meta-llama/llama-3.1-8b"


def test_round_trip_through_dump(tmp_path: Path) -> None:
    cfg = load_config(config_arg=json.dumps(DYNAMO_LEGACY)).config
    path = tmp_path / "dumped.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    assert load_config(config_arg=str(path)).config == cfg


def test_optimization_target_easy_mode_runs_load_loop_only() -> None:
    cfg = load_config(config_arg='{"optimization_target": "load"}').config
    assert cfg.load_scaling_active and not cfg.throughput_scaling_active


# --- validation rules ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "path", "fragment"),
    [
        ({"ttft": -5}, "ttft (ttft_ms)", "greater than 0"),
        ({"itl_ms": 0}, "itl_ms", "greater than 0"),
        (
            {"enable_load_scaling": True, "load_adjustment_interval": 200},
            "load_adjustment_interval (load_adjustment_interval_seconds)",
            "shorter than throughput_adjustment_interval_seconds (180)",
        ),
        (
            {"enable_throughput_scaling": False},
            "enable_throughput_scaling",
            "at least one scaling loop",
        ),
        ({"max_gpu_budget": 0}, "max_gpu_budget", "-1 (no limit) or a positive"),
        ({"min_gpu_budget": -3}, "min_gpu_budget", "-1 (no limit) or a positive"),
        ({"min_gpu_budget": 9, "max_gpu_budget": 8}, "min_gpu_budget", "must not exceed"),
        (
            {"max_gpu_budget": 4, "min_endpoint": 2, "prefill_engine_num_gpu": 2},
            "max_gpu_budget",
            "below the GPUs the minimum endpoints need (6)",
        ),
        ({"mode": "agg", "prefill_min_endpoint": 2}, "prefill_min_endpoint", "mode=agg"),
        ({"mode": "prefill", "decode_min_endpoint": 1}, "decode_min_endpoint", "mode=prefill"),
        ({"mode": "decode", "prefill_min_endpoint": 1}, "prefill_min_endpoint", "mode=decode"),
        ({"fpm_sample_bucket_size": 10}, "fpm_sample_bucket_size", "perfect square"),
        ({"report_interval_hours": -1}, "report_interval_hours", "positive, finite"),
        ({"load_scaling_down_sensitivity": 101}, "load_scaling_down_sensitivity", "less than"),
        ({"load_predictor": "lstm"}, "load_predictor", "'constant'"),
        ({"max_gpu_bugdet": 4}, "max_gpu_bugdet", "did you mean 'max_gpu_budget'"),
        (
            {"metric_pulling_prometheus_endpoint": "prom:9090"},
            "metric_pulling_prometheus_endpoint",
            "http:// or https://",
        ),
        (
            {"metric_pulling_prometheus_ca_bundle": "/nonexistent/ca.pem"},
            "metric_pulling_prometheus_ca_bundle",
            "existing PEM file",
        ),
        (
            {"environment": "virtual"},
            "prefill_engine_num_gpu",
            "required with environment=virtual",
        ),
    ],
)
def test_each_rule_names_field_and_rule(config: dict, path: str, fragment: str) -> None:
    problems = problems_of(config_arg=json.dumps(config), environ={})
    assert path in problems, problems
    assert fragment in problems[path]


def test_every_problem_is_reported_at_once() -> None:
    bad = {"ttft": -1, "itl": -1, "mode": "agg", "prefill_min_endpoint": 2, "typo_key": 1}
    problems = problems_of(config_arg=json.dumps(bad), environ={})
    assert set(problems) == {"ttft (ttft_ms)", "itl (itl_ms)", "prefill_min_endpoint", "typo_key"}


def test_bad_file_names_itself(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("ttft: [unclosed\n")
    problems = problems_of(config_arg=str(path), environ={})
    assert "cannot be parsed (file" in problems["--config"]
    assert str(path) in problems["--config"]


def test_direct_construction_enforces_cross_field_rules() -> None:
    with pytest.raises(ValueError, match="prefill_min_endpoint"):
        PlannerConfig(mode="decode", prefill_min_endpoint=2)


def test_bad_env_value_names_the_variable() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(environ={"PLANNER_TTFT": "fast"})
    (problem,) = info.value.problems
    assert problem.path == "ttft_ms" and problem.source == "env PLANNER_TTFT"


# --- CLI ---------------------------------------------------------------------------------


def test_cli_validate_rejects_negative_ttft(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "validate", '{"ttft": -5}']) == 2
    err = capsys.readouterr().err
    assert "ttft" in err and "greater than 0" in err


def test_cli_validate_accepts_good_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(DYNAMO_LEGACY))
    assert main(["config", "validate", str(path)]) == 0
    assert "valid" in capsys.readouterr().out


def test_cli_show_attributes_every_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "planner.yaml"
    path.write_text("ttft: 100\nitl: 10\nkalman_r: 3\n")
    monkeypatch.setenv("PLANNER_ITL", "20")
    monkeypatch.setenv("PLANNER_KALMAN_R", "4")
    code = main(["config", "show", "--config", str(path), "--ttft", "300", "--no-correction"])
    assert code == 0
    lines = {line.split(":")[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "300.0" in lines["ttft_ms"] and "# flag" in lines["ttft_ms"]
    assert "20.0" in lines["itl_ms"] and "# env PLANNER_ITL" in lines["itl_ms"]
    assert "4.0" in lines["kalman_r"] and "# env PLANNER_KALMAN_R" in lines["kalman_r"]
    assert "true" in lines["no_correction"] and "# flag" in lines["no_correction"]
    assert "# default" in lines["mode"]
    shown = yaml.safe_load("\n".join(line.split("  #")[0] for line in lines.values()))
    assert shown["ttft_ms"] == 300.0


def test_cli_flag_overrides_env_overrides_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "planner.json"
    path.write_text('{"adjustment_interval": 60}')
    monkeypatch.setenv("PLANNER_ADJUSTMENT_INTERVAL", "90")
    main(["config", "show", "--config", str(path)])
    assert "throughput_adjustment_interval_seconds: 90.0" in capsys.readouterr().out
    main(["config", "show", "--config", str(path), "--adjustment-interval", "120"])
    assert "throughput_adjustment_interval_seconds: 120.0" in capsys.readouterr().out


def test_cli_bad_flag_value_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "--max-gpu-budget", "zero"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "max_gpu_budget" in err[0]


def test_help_lists_dynamo_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["config", "show", "--help"])
    out = capsys.readouterr().out
    for flag in (
        "--adjustment-interval",
        "--load-predictor",
        "--no-correction",
        "--load-predictor-warmup-trace",
        "--kalman-min-points",
        "--environment",
        "--mode",
        "--ttft",
        "--itl",
        "--max-gpu-budget",
        "--min-endpoint",
        "--prefill-engine-num-gpu",
        "--decode-engine-num-gpu",
        "--profile-results-dir",
        "--metric-pulling-prometheus-endpoint",
        "--metric-reporting-prometheus-port",
        "--enable-throughput-scaling",
        "--no-enable-throughput-scaling",
        "--enable-load-scaling",
        "--no-enable-load-scaling",
        "--load-adjustment-interval",
    ):
        assert flag in out, flag


@pytest.mark.parametrize("argv", [["--help"], ["config", "--help"]])
def test_top_level_and_config_help_list_the_flags(argv, capsys) -> None:
    with pytest.raises(SystemExit):
        main(argv)
    out = capsys.readouterr().out
    for flag in (
        "--adjustment-interval",
        "--load-predictor",
        "--no-correction",
        "--ttft",
        "--itl",
        "--max-gpu-budget",
        "--min-endpoint",
        "--kalman-min-points",
        "--enable-load-scaling/--no-enable-load-scaling",
        "--metric-pulling-prometheus-endpoint",
        "--load-predictor-warmup-trace",
    ):
        assert flag in out, flag
