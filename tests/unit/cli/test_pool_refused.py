"""``pool`` is served by the operator and by ``planner replay --fleet``: the commands that plan
one deployment alone refuse it rather than ignore it."""

from __future__ import annotations

from pathlib import Path

import pytest

from disagg_planner.cli.main import main


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["replay", "--workload", "poisson:rate=1,duration=10,isl=10,osl=10"], "planner replay"),
        (
            [
                "run",
                "--environment",
                "virtual",
                "--prefill-engine-num-gpu",
                "1",
                "--decode-engine-num-gpu",
                "1",
            ],
            "planner run",
        ),
    ],
    ids=["replay", "run"],
)
def test_a_single_deployment_command_refuses_a_pool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], command: str
) -> None:
    extra = ["-o", str(tmp_path / "out")] if argv[0] == "replay" else []
    assert main([*argv, *extra, "--pool", "gpus"]) == 2
    err = capsys.readouterr().err
    assert f"pool = 'gpus': {command}" in err and "planner operator" in err
