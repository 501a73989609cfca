"""Command-line flags generated from :class:`PlannerConfig`, never written by hand.

Each field gets ``--field-name``; each alias gets its own spelling too (``--ttft``,
``--adjustment-interval``, ``--enable-loadbased-scaling`` ...), so Dynamo's flags work. A
boolean gets ``--x`` and ``--no-x``. Values stay strings here; pydantic converts and validates
them together with the other sources, so a bad flag is reported like a bad file value.
"""

from __future__ import annotations

import argparse
import textwrap
import typing
from typing import Any, get_args, get_origin

from disagg_planner.config.loader import field_names_by_key
from disagg_planner.config.schema import PlannerConfig

_DEST_PREFIX = "cfg__"

_GROUP_TITLES = {
    "deployment": "deployment",
    "slo": "SLOs and scaling loops",
    "budget": "budgets and replica floors",
    "prediction": "load prediction",
    "profile": "performance profile",
    "prometheus": "traffic metrics (Prometheus)",
    "load": "load-based scaling",
    "reporting": "planner metrics and reports",
    "elastic": "elastic expert parallelism (resize an engine's data-parallel size)",
}


def _is_bool(annotation: Any) -> bool:
    if annotation is bool:
        return True
    return get_origin(annotation) in (typing.Union, type(int | None)) and bool in get_args(
        annotation
    )


def _choices(annotation: Any) -> list[str] | None:
    if get_origin(annotation) is typing.Literal:
        return [str(a) for a in get_args(annotation)]
    return None


class _BooleanFlag(argparse.Action):
    """``--x`` sets True and ``--no-x`` False, also for fields that begin with ``no_``
    (argparse's BooleanOptionalAction reads any ``--no-`` prefix as False)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        self._negatives = {"--no-" + s.removeprefix("--") for s in option_strings}
        super().__init__(
            option_strings=option_strings + sorted(self._negatives), dest=dest, nargs=0, **kwargs
        )

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, option_string not in self._negatives)

    def format_usage(self) -> str:
        return " | ".join(self.option_strings)


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--config`` and one flag (plus alias spellings) per config field."""
    parser.add_argument(
        "--config",
        metavar="FILE|JSON",
        help="YAML or JSON config file, or inline JSON; Dynamo's planner configs load as is.",
    )
    aliases: dict[str, list[str]] = {}
    for key, name in field_names_by_key().items():
        if key != name:
            aliases.setdefault(name, []).append(key)

    groups: dict[str, argparse._ArgumentGroup] = {}
    for name, info in PlannerConfig.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        group_key = str(extra.get("group", "other"))
        if group_key not in groups:
            groups[group_key] = parser.add_argument_group(_GROUP_TITLES.get(group_key, group_key))
        group = groups[group_key]
        spellings = [_flag(name)] + [_flag(a) for a in aliases.get(name, [])]
        spellings += [str(f) for f in extra.get("flags", [])]  # type: ignore[union-attr]
        default_text = "" if info.default is None else f" (default: {info.default})"
        help_text = ((info.description or "") + default_text).replace("%", "%%")
        dest = _DEST_PREFIX + name
        if _is_bool(info.annotation):
            group.add_argument(
                *spellings[:1],
                dest=dest,
                action=_BooleanFlag,
                default=argparse.SUPPRESS,
                help=help_text,
            )
            for spelling in spellings[1:]:
                group.add_argument(
                    spelling,
                    dest=dest,
                    action="store_const",
                    const=True,
                    default=argparse.SUPPRESS,
                    help=f"alias of {spellings[0]}",
                )
            continue
        choices = _choices(info.annotation)
        group.add_argument(
            *spellings,
            dest=dest,
            default=argparse.SUPPRESS,
            choices=choices,
            metavar=None if choices else name.split("_")[-1].upper(),
            help=help_text,
        )


def flag_summary() -> str:
    """Every config flag spelling, for the epilog of ``planner --help``/``config --help``."""
    spellings: list[str] = []
    aliases: dict[str, list[str]] = {}
    for key, name in field_names_by_key().items():
        if key != name:
            aliases.setdefault(name, []).append(key)
    for name, info in PlannerConfig.model_fields.items():
        keys = [name, *aliases.get(name, [])]
        if _is_bool(info.annotation):
            spellings += [f"{_flag(k)}/--no-{k.replace('_', '-')}" for k in keys[:1]]
            spellings += [_flag(k) for k in keys[1:]]
        else:
            spellings += [_flag(k) for k in keys]
    text = (
        "Planner settings (flags of config show, plan, replay, run and operator; also "
        "--config FILE and PLANNER_* variables): " + ", ".join(spellings)
    )
    return textwrap.fill(text, width=88, break_on_hyphens=False, break_long_words=False)


def config_flags(namespace: argparse.Namespace) -> dict[str, Any]:
    """The config fields given on the command line, by field name."""
    return {
        key.removeprefix(_DEST_PREFIX): _null(value)
        for key, value in vars(namespace).items()
        if key.startswith(_DEST_PREFIX)
    }


def _null(value: Any) -> Any:
    """``--x null`` (or ``none``) unsets an optional setting, as in the environment."""
    if isinstance(value, str) and value.strip().lower() in {"null", "none"}:
        return None
    return value
