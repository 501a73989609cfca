"""Fill a :class:`PlannerConfig` from its four sources and remember where each value came from.

Precedence, lowest first: defaults < ``--config`` (file or inline JSON/YAML) < environment
(``PLANNER_<NAME>`` for every field and alias, plus Dynamo's own variable names) < flags.
Operator mode adds the policy object's spec on top through ``overrides``.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from disagg_planner.config.schema import (
    DYNAMO_KEYS_NOT_APPLICABLE,
    PlannerConfig,
    cross_field_problems,
)
from disagg_planner.errors import ConfigError, ConfigProblem

log = logging.getLogger(__name__)

ENV_PREFIX = "PLANNER_"


def field_names_by_key() -> dict[str, str]:
    """Every accepted key (field name or alias) mapped to its field name."""
    keys: dict[str, str] = {}
    for name, info in PlannerConfig.model_fields.items():
        keys[name] = name
        alias = info.validation_alias
        if alias is not None and hasattr(alias, "choices"):
            for choice in alias.choices:
                if isinstance(choice, str):
                    keys[choice] = name
    return keys


def env_names_by_field() -> dict[str, list[str]]:
    """Environment variables read for each field, in rising priority."""
    names: dict[str, list[str]] = {}
    keys = field_names_by_key()
    for key, name in keys.items():
        if key != name:
            names.setdefault(name, []).append(ENV_PREFIX + key.upper())
    for name, info in PlannerConfig.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        dynamo_env = [str(e) for e in extra.get("env", [])]  # type: ignore[union-attr]
        # Dynamo's own names rank below ours, which are the more specific
        names[name] = dynamo_env + names.get(name, []) + [ENV_PREFIX + name.upper()]
    return names


@dataclass
class LoadedConfig:
    """The validated config, where each field's value came from, and what was ignored."""

    config: PlannerConfig
    sources: dict[str, str]
    ignored_keys: list[str] = field(default_factory=list)


def read_config_arg(arg: str) -> tuple[dict[str, Any], str]:
    """Parse ``--config``: a .yaml/.yml/.json path, another existing path, or inline JSON."""
    text: str
    label: str
    stripped = arg.strip()
    if stripped.startswith("{"):
        text, label = stripped, "inline config"
    else:
        path = Path(arg)
        if not path.is_file():
            raise ConfigError(
                [ConfigProblem("--config", arg, "is neither an existing file nor inline JSON")]
            )
        text, label = path.read_text(encoding="utf-8"), f"file {path}"
    try:
        if label.endswith(".json") or label == "inline config":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(
            [
                ConfigProblem(
                    "--config",
                    arg if len(arg) < 80 else arg[:77] + "...",
                    f"cannot be parsed ({label}): {exc}",
                )
            ]
        ) from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            [ConfigProblem("--config", type(data).__name__, f"{label} must hold a mapping")]
        )
    return data, label


def _from_environment(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, env_names in env_names_by_field().items():
        for env_name in env_names:  # later names win
            if env_name in environ and environ[env_name] != "":
                values[name] = _env_value(environ[env_name])
                sources[name] = f"env {env_name}"
    return values, sources


def _env_value(raw: str) -> Any:
    return None if raw.strip().lower() in {"none", "null"} else raw


def _canonical(
    data: Mapping[str, Any],
    source: str,
    problems: list[ConfigProblem],
    ignored: list[str],
    given_as: dict[str, str],
) -> dict[str, Any]:
    """Map aliases to field names; collect unknown keys as problems with a suggestion."""
    keys = field_names_by_key()
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in keys:
            out[keys[key]] = value
            given_as[keys[key]] = key
        elif key in DYNAMO_KEYS_NOT_APPLICABLE:
            ignored.append(key)
        else:
            close = difflib.get_close_matches(str(key), list(keys), n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            problems.append(
                ConfigProblem(str(key), value, f"is not a planner setting{hint}", source)
            )
    return out


def load_config(
    *,
    config_arg: str | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
    overrides_label: str = "policy",
) -> LoadedConfig:
    """Merge the sources, validate, and report every problem at once as a ConfigError."""
    problems: list[ConfigProblem] = []
    ignored: list[str] = []
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    given_as: dict[str, str] = {}

    if config_arg is not None:
        data, label = read_config_arg(config_arg)
        for name, value in _canonical(data, label, problems, ignored, given_as).items():
            merged[name], sources[name] = value, label
    env_values, env_sources = _from_environment(os.environ if environ is None else environ)
    merged.update(env_values)
    sources.update(env_sources)
    for layer, label in ((flags, "flag"), (overrides, overrides_label)):
        if layer:
            for name, value in _canonical(layer, label, problems, ignored, given_as).items():
                merged[name] = value
                sources[name] = label if label != "flag" else f"flag --{name.replace('_', '-')}"

    config = _validate(merged, sources, problems, given_as)
    for key in ignored:
        log.warning("config key %r configures a Dynamo subsystem this planner lacks; ignored", key)
    for name in PlannerConfig.model_fields:
        sources.setdefault(name, "default")
    return LoadedConfig(config=config, sources=sources, ignored_keys=sorted(set(ignored)))


def _validate(
    merged: dict[str, Any],
    sources: dict[str, str],
    problems: list[ConfigProblem],
    given_as: Mapping[str, str],
) -> PlannerConfig:
    bad_fields: set[str] = set()
    try:
        config = PlannerConfig.model_validate(merged, context={"skip_cross_field": True})
    except ValidationError as exc:
        for err in exc.errors():
            loc = err.get("loc") or ("config",)
            name = str(loc[0])
            bad_fields.add(name)
            path = ".".join(str(p) for p in loc)
            if given_as.get(name, name) != name:
                path = f"{given_as[name]} ({path})"
            problems.append(ConfigProblem(path, err.get("input"), _rule(err), sources.get(name)))
        # Re-validate without the broken fields so that the cross-field rules still run.
        partial = {k: v for k, v in merged.items() if k not in bad_fields}
        try:
            config = PlannerConfig.model_validate(partial, context={"skip_cross_field": True})
        except ValidationError:
            raise ConfigError(problems) from None
    for problem in cross_field_problems(config):
        if problem.path not in bad_fields:
            name = problem.path
            path = name if given_as.get(name, name) == name else f"{given_as[name]} ({name})"
            problems.append(ConfigProblem(path, problem.value, problem.rule, sources.get(name)))
    if problems:
        raise ConfigError(problems)
    return config


def _rule(err: Mapping[str, Any]) -> str:
    msg = str(err.get("msg", "invalid"))
    return msg.removeprefix("Value error, ")
