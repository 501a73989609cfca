"""A command-line mistake prints the command's usage in one line and the error, for every
command and sub-command (argparse's own usage of a command with the config flags ran to about
a hundred lines before the error)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from disagg_planner.cli.main import build_parser, main


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, ...]]:
    """Every command path of the CLI: (), ("replay",), ("profile", "show") ..."""
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


ALL = list(commands(build_parser()))


def error_lines(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err.splitlines()


def test_every_command_is_covered() -> None:
    assert {path[0] for path in ALL if path} >= {
        "config", "profile", "plan", "replay", "report", "run", "operator", "backtest"
    }  # fmt: skip
    assert ("profile", "show") in ALL and ("config", "show") in ALL


@pytest.mark.parametrize("path", ALL, ids=lambda p: " ".join(p) or "planner")
def test_an_unknown_option_is_two_lines_named_by_its_command(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    prog = " ".join(("planner", *path))
    usage, error = error_lines(capsys, [*path, "--no-such-option"])
    assert usage.startswith(f"usage: {prog} ")
    assert usage.endswith(f"({prog} --help: every option)")
    assert error.startswith(f"{prog}: error: ")
    # a command with required arguments reports those first; the others, the unknown option
    assert error.endswith("unrecognized arguments: --no-such-option") or (
        "the following arguments are required" in error or error.endswith(" is required")
    )


def test_a_missing_required_argument_names_what_the_command_requires(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert error_lines(capsys, ["plan", "--isl", "3000"]) == [
        "usage: planner plan [options] --num-req NUM_REQ --isl ISL --osl OSL  "
        "(planner plan --help: every option)",
        "planner plan: error: the following arguments are required: --num-req, --osl",
    ]


def test_a_bad_value_is_the_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    _, error = error_lines(capsys, ["backtest", "--trace", "t.jsonl", "--interval", "soon"])
    assert error.startswith("planner backtest: error: argument --interval: 'soon': expected ")


def test_a_bad_choice_is_the_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    usage, error = error_lines(capsys, ["replay", "--log-level", "LOUD"])
    assert usage == "usage: planner replay [options]  (planner replay --help: every option)"
    assert error.startswith("planner replay: error: argument --log-level: invalid choice: 'LOUD'")


def test_an_unknown_option_of_a_nested_command_names_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert error_lines(capsys, ["profile", "show", "some-profile", "--bogus", "1"]) == [
        "usage: planner profile show [options] DIR|NAME  (planner profile show --help: every "
        "option)",
        "planner profile show: error: unrecognized arguments: --bogus 1",
    ]


def test_a_required_choice_of_options_is_shown_as_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    usage, error = error_lines(capsys, ["report"])
    assert usage == (
        "usage: planner report [options] (--compare | --live)  "
        "(planner report --help: every option)"
    )
    assert error == "planner report: error: one of the arguments --compare --live is required"


def test_an_unknown_command_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    usage, error = error_lines(capsys, ["replya"])
    assert usage == "usage: planner [options] [COMMAND]  (planner --help: every option)"
    assert error.startswith("planner: error: argument COMMAND: invalid choice: 'replya'")
