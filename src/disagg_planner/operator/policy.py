"""From a ``PlannerPolicy`` object to the :class:`PlannerConfig` of its DGD's loop.

Precedence, lowest first: defaults < the operator's ``--config`` < its environment < its
flags < the policy's ``spec`` < what the operator sets itself (``environment=kubernetes``,
``dgd_name`` from ``targetRef.name``, ``kubernetes_namespace`` = the policy's namespace).
When nothing sets ``namespace`` (the Dynamo namespace that filters the frontend metrics), it
is Dynamo operator's convention for a DGD, ``{kubernetes namespace}-{dgd name}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from disagg_planner.config.loader import load_config
from disagg_planner.config.schema import PlannerConfig
from disagg_planner.errors import ConfigError, ConfigProblem
from disagg_planner.operator.crd import (
    KIND,
    OPERATOR_SET_FIELDS,
    TARGET_API_VERSION,
    TARGET_KIND,
)
from disagg_planner.runtime.loop import DeploymentRef


@dataclass(frozen=True)
class OperatorDefaults:
    """The operator's own config sources, under every policy's spec."""

    config_arg: str | None = None
    flags: Mapping[str, Any] = field(default_factory=dict)
    environ: Mapping[str, str] | None = None  # None: the process environment


def plain(value: Any) -> Any:
    """A deep, plain-JSON copy of a (possibly live, kopf-owned) mapping."""
    return json.loads(json.dumps(value, default=dict))


def target_of(spec: Mapping[str, Any], *, namespace: str, policy: str) -> DeploymentRef:
    """The DGD a policy names. Raises ConfigError naming the field."""
    where = f"{KIND} {namespace}/{policy}"
    ref = spec.get("targetRef")
    if not isinstance(ref, Mapping):
        raise ConfigError(
            [ConfigProblem("spec.targetRef", ref, "must be a map with the DGD's name", where)]
        )
    problems = []
    name = ref.get("name")
    if not isinstance(name, str) or not name:
        problems.append(ConfigProblem("spec.targetRef.name", name, "must be a DGD name", where))
    kind = ref.get("kind", TARGET_KIND)
    if kind != TARGET_KIND:
        problems.append(ConfigProblem("spec.targetRef.kind", kind, f"must be {TARGET_KIND}", where))
    api_version = ref.get("apiVersion", TARGET_API_VERSION)
    if api_version != TARGET_API_VERSION:
        problems.append(
            ConfigProblem(
                "spec.targetRef.apiVersion", api_version, f"must be {TARGET_API_VERSION}", where
            )
        )
    if problems:
        raise ConfigError(problems)
    assert isinstance(name, str)
    return DeploymentRef(namespace, name)


def config_from_spec(
    spec: Mapping[str, Any],
    *,
    namespace: str,
    policy: str,
    defaults: OperatorDefaults,
) -> PlannerConfig:
    """The validated config of a policy's loop. Raises ConfigError listing every problem."""
    target = target_of(spec, namespace=namespace, policy=policy)
    label = f"{KIND} {namespace}/{policy}"
    settings = {k: v for k, v in spec.items() if k != "targetRef"}
    forbidden = [k for k in settings if k in OPERATOR_SET_FIELDS]
    if forbidden:
        raise ConfigError(
            [
                ConfigProblem(
                    f"spec.{k}", settings[k], "is set by the operator, not by a policy", label
                )
                for k in forbidden
            ]
        )
    overrides = {
        **settings,
        "environment": "kubernetes",
        "dgd_name": target.name,
        "kubernetes_namespace": target.namespace,
    }
    loaded = load_config(
        config_arg=defaults.config_arg,
        environ=defaults.environ,
        flags=defaults.flags,
        overrides=overrides,
        overrides_label=label,
    )
    config = loaded.config
    if loaded.sources.get("namespace", "default") == "default":
        config = config.model_copy(update={"namespace": f"{target.namespace}-{target.name}"})
    return config
