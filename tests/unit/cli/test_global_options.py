"""The global options of ``planner`` work before or after the sub-command, and ``--debug``
adds a traceback without changing the exit code scripts depend on."""

from __future__ import annotations

import logging

import pytest

from disagg_planner.cli.main import build_parser, main


@pytest.mark.parametrize(
    "argv",
    [
        ["--log-level", "WARNING", "config", "show", "--ttft", "300"],
        ["config", "--log-level", "WARNING", "show", "--ttft", "300"],
        ["config", "show", "--log-level", "warning", "--ttft", "300"],
    ],
    ids=["before", "between", "after"],
)
def test_log_level_is_accepted_anywhere(argv: list[str], capsys: pytest.CaptureFixture[str]):
    assert main(argv) == 0
    assert "ttft_ms: 300" in capsys.readouterr().out
    assert logging.getLogger().level == logging.WARNING


def test_an_option_before_the_sub_command_is_not_reset_by_its_default(
    capsys: pytest.CaptureFixture[str],
):
    assert main(["--log-level", "ERROR", "profile", "list"]) == 0
    assert logging.getLogger().level == logging.ERROR


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_keeps_the_exit_code_of_a_user_error(where: str, capsys: pytest.CaptureFixture[str]):
    args = ["profile", "show", "no/such/profile", "--isl", "3000", "--osl", "300", "--itl", "20"]
    plain = main(args)
    capsys.readouterr()
    debug = main(["--debug", *args] if where == "before" else [*args, "--debug"])
    err = capsys.readouterr().err
    assert plain == debug == 2
    assert "Traceback (most recent call last)" in err
    assert err.rstrip().splitlines()[-1].startswith("planner: ")


def test_replay_takes_the_global_options_after_it() -> None:
    # ``planner replay --log-level WARNING`` was refused with "unrecognized arguments".
    args = build_parser().parse_args(["replay", "--log-level", "WARNING", "--debug"])
    assert args.log_level == "WARNING" and args.debug is True
    assert build_parser().parse_args(["replay"]).log_level == "INFO"
