"""``planner config show`` and ``planner config validate``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from disagg_planner.config import load_config
from disagg_planner.config.flags import add_config_arguments, config_flags, flag_summary
from disagg_planner.errors import ConfigError


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "config",
        help="Show or validate the effective configuration.",
        description="Show or validate the effective configuration. Precedence, lowest first: "
        "defaults < --config < environment (PLANNER_*, Dynamo's names) < flags.",
        epilog=flag_summary(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="config_action", metavar="ACTION", required=True)

    show = actions.add_parser(
        "show",
        help="Print the effective config as YAML, with where each value came from.",
        description="Print the effective config as YAML; each line's comment says whether the "
        "value is the default or came from the file, the environment or a flag.",
    )
    add_config_arguments(show)
    show.set_defaults(handler=_show)

    validate = actions.add_parser(
        "validate",
        help="Check a config file; exit 0 if valid, else print every problem and exit 2.",
    )
    validate.add_argument("file", help="YAML or JSON config file, or inline JSON")
    validate.add_argument(
        "--no-env", action="store_true", help="Ignore PLANNER_* and other environment variables."
    )
    validate.set_defaults(handler=_validate)


def _show(args: argparse.Namespace) -> int:
    loaded = load_config(config_arg=args.config, flags=config_flags(args))
    values = loaded.config.model_dump(mode="json")
    rendered = {
        key: yaml.safe_dump({key: value}, default_flow_style=True, width=10**6)
        .strip()
        .removeprefix("{")
        .removesuffix("}")
        for key, value in values.items()
    }
    width = min(max(len(r) for r in rendered.values()), 70)
    lines = [f"{text:<{width}}  # {loaded.sources[key]}" for key, text in rendered.items()]
    for key in loaded.ignored_keys:
        lines.append(f"# ignored: {key} (a Dynamo subsystem this planner does not have)")
    print("\n".join(lines))
    return 0


def _validate(args: argparse.Namespace) -> int:
    try:
        load_config(config_arg=args.file, environ={} if args.no_env else None)
    except ConfigError as exc:
        print(f"planner: invalid configuration ({len(exc.problems)} problem(s)):", file=sys.stderr)
        for problem in exc.problems:
            print(f"  - {problem.render()}", file=sys.stderr)
        return exc.exit_code
    print(f"{args.file}: valid")
    return 0
