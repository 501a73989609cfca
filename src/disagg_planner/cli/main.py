"""Entry point of the ``planner`` command.

Each sub-command lives in its own module with ``register(subparsers)``, which adds its parser
and sets ``handler`` (a function of the parsed arguments returning an exit status). User
mistakes end with one line on stderr and the exit code of their error class; a traceback is
shown only with ``--debug``, which never changes the exit code.

The global options (``--log-level``, ``--log-format``, ``--debug``) are accepted before or
after the sub-command: ``planner replay --log-level WARNING`` is ``planner --log-level WARNING
replay``.

A command-line mistake (an unknown option, a missing or bad value) prints two lines: the
command's usage in one line (what it requires, ``[options]`` for the rest) and the error,
named by the (sub-)command it belongs to. argparse's own usage of a command with the config
flags runs to about a hundred lines, with the error last.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

from disagg_planner import __version__
from disagg_planner.cli import (
    backtest_cmd,
    config_cmd,
    operator_cmd,
    plan_cmd,
    profile_cmd,
    replay_cmd,
    report_cmd,
    run_cmd,
)
from disagg_planner.cli.logging_setup import configure_logging
from disagg_planner.config.flags import flag_summary
from disagg_planner.errors import classify

log = logging.getLogger(__name__)

COMMANDS: tuple[ModuleType, ...] = (
    config_cmd,
    profile_cmd,
    plan_cmd,
    replay_cmd,
    report_cmd,
    run_cmd,
    operator_cmd,
    backtest_cmd,
)


GLOBAL_DEFAULTS = {"log_level": "INFO", "log_format": "text", "debug": False}


def _global_options(*, suppress_defaults: bool) -> argparse.ArgumentParser:
    """The options every command takes. On the sub-commands their defaults are suppressed, so
    a value given before the sub-command is not reset by the sub-parser's default."""
    options = argparse.ArgumentParser(add_help=False)

    def default(name: str) -> object:
        return argparse.SUPPRESS if suppress_defaults else GLOBAL_DEFAULTS[name]

    options.add_argument(
        "--log-level",
        default=default("log_level"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="Least severe log level shown (default: INFO).",
    )
    options.add_argument(
        "--log-format",
        default=default("log_format"),
        choices=["text", "json"],
        help="Log line format.",
    )
    options.add_argument(
        "--debug",
        action="store_true",
        default=default("debug"),
        help="Show tracebacks for user errors too (the exit code stays the same).",
    )
    return options


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one usage line and the error (module doc)."""

    def short_usage(self) -> str:
        """``PROG`` and what it requires, in one line; ``[options]`` stands for the rest."""
        formatter = self._get_formatter()
        parts = [self.prog]
        optional = False
        grouped = {
            a for g in self._mutually_exclusive_groups if g.required for a in g._group_actions
        }
        for group in self._mutually_exclusive_groups:
            if group.required:
                parts.append("(" + " | ".join(_longest(a) for a in group._group_actions) + ")")
        for action in self._actions:
            if action.help == argparse.SUPPRESS or action in grouped:
                continue
            if isinstance(action, argparse._SubParsersAction):
                name = action.metavar or "{" + ",".join(action.choices or ()) + "}"
                parts.append(str(name) if action.required else f"[{name}]")
            elif not action.option_strings:
                parts.append(formatter._format_args(action, action.dest))
            elif action.required:
                value = (
                    ""
                    if action.nargs == 0
                    else " " + formatter._format_args(action, action.dest.upper())
                )
                parts.append(_longest(action) + value)
            else:
                optional = True
        if optional:
            parts.insert(1, "[options]")
        return " ".join(parts)

    def error(self, message: str) -> NoReturn:
        self.exit(
            2,
            f"usage: {self.short_usage()}  ({self.prog} --help: every option)\n"
            f"{self.prog}: error: {message}\n",
        )


def _longest(action: argparse.Action) -> str:
    """The action's longest spelling (``--output`` rather than ``-o``)."""
    return max(action.option_strings, key=len)


def _deepest_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> _Parser:
    """The (sub-)parser of the command ``args`` chose (``planner profile show`` -> ``show``)."""
    current = parser
    while True:
        sub = next((a for a in current._actions if isinstance(a, argparse._SubParsersAction)), None)
        chosen = None if sub is None else getattr(args, sub.dest, None)
        if sub is None or chosen not in (sub.choices or {}):
            break
        current = sub.choices[chosen]
    assert isinstance(current, _Parser)
    return current


class _SubParsers(argparse._SubParsersAction):
    """Adds the global options to every sub-command's parser, nested ones (``config show``)
    included."""

    def add_parser(self, name: str, **kwargs: object) -> argparse.ArgumentParser:
        parents = list(kwargs.pop("parents", None) or [])  # type: ignore[call-overload]
        kwargs["parents"] = [*parents, _global_options(suppress_defaults=True)]
        parser = super().add_parser(name, **kwargs)  # type: ignore[arg-type]
        parser.register("action", "parsers", _SubParsers)
        return parser


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="planner",
        description="SLO-driven autoscaler for disaggregated LLM inference on Kubernetes.",
        epilog=flag_summary(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[_global_options(suppress_defaults=False)],
    )
    parser.add_argument("--version", action="version", version=f"planner {__version__}")
    parser.register("action", "parsers", _SubParsers)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # argparse names the top-level parser for a sub-command's unknown option
        _deepest_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    configure_logging(args.log_level, args.log_format)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        user_error = classify(exc)
        if user_error is None:
            raise
        if args.debug:
            # The traceback is for the reader; scripts keep seeing the error's own exit code.
            traceback.print_exception(exc, file=sys.stderr)
        print(f"planner: {user_error.kind}: {exc}", file=sys.stderr)
        return user_error.exit_code


if __name__ == "__main__":
    sys.exit(main())
