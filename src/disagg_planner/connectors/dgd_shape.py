"""The shape of a DynamoGraphDeployment (``nvidia.com/v1alpha1``): pure rules over the DGD
object that find the service of a role and read its GPUs, model, replicas and readiness.

See :mod:`disagg_planner.connectors.kubernetes` for how the connector uses them; nothing here
talks to the API server.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from disagg_planner.errors import DeploymentError

# Dynamo 1.x's worker service names per backend, for DGDs that predate subComponentType.
LEGACY_SERVICE_NAMES: Mapping[str, Mapping[str, str]] = {
    "vllm": {"prefill": "VllmPrefillWorker", "decode": "VllmDecodeWorker"},
    "sglang": {"prefill": "prefill", "decode": "decode"},
    "trtllm": {"prefill": "TRTLLMPrefillWorker", "decode": "TRTLLMDecodeWorker"},
    "mocker": {"prefill": "prefill", "decode": "decode"},
}

# Aggregated workers are the decode-type service of an aggregated graph (Dynamo's agg planner).
ROLE_SUB_COMPONENT: Mapping[str, str] = {"prefill": "prefill", "decode": "decode", "agg": "decode"}

# Engine flags that name the served model, in Dynamo's order of preference.
MODEL_NAME_FLAGS = ("--served-model-name", "--model-name", "--model")


@dataclass(frozen=True)
class ResolvedService:
    """The DGD service that carries one role, and how it was found."""

    role: str
    service: str
    sub_component_type: str
    matched_by: str  # "subComponentType" or "legacy name"
    gpus_per_replica: int
    model_name: str | None


def dgd_services(dgd: Mapping[str, Any], ref: str) -> Mapping[str, Mapping[str, Any]]:
    """``spec.services`` of a v1alpha1 DGD, checked to be a map of maps."""
    spec = dgd.get("spec")
    services = spec.get("services") if isinstance(spec, Mapping) else None
    if not isinstance(services, Mapping):
        hint = ""
        if isinstance(spec, Mapping) and "components" in spec:
            hint = " (it has spec.components: a v1beta1 object; this planner reads v1alpha1)"
        raise DeploymentError(f"DynamoGraphDeployment {ref} has no spec.services map{hint}")
    for name, service in services.items():
        if not isinstance(service, Mapping):
            raise DeploymentError(
                f"DynamoGraphDeployment {ref}: spec.services.{name} is "
                f"{type(service).__name__}, expected a map"
            )
    return services


def resolve_service(
    services: Mapping[str, Mapping[str, Any]], sub_component_type: str, backend: str, ref: str
) -> tuple[str, str]:
    """The service name for ``sub_component_type`` and how it matched.

    By ``subComponentType`` first; the backend's legacy name only for a service that has no
    ``subComponentType``. Raises DeploymentError for duplicates or no match.
    """
    matches = sorted(
        name for name, svc in services.items() if svc.get("subComponentType") == sub_component_type
    )
    if len(matches) > 1:
        raise DeploymentError(
            f"DynamoGraphDeployment {ref}: services {matches} all have subComponentType "
            f"'{sub_component_type}'; exactly one service may have it"
        )
    if matches:
        return matches[0], "subComponentType"
    legacy = LEGACY_SERVICE_NAMES[backend][sub_component_type]
    legacy_service = services.get(legacy)
    if legacy_service is not None:
        other = legacy_service.get("subComponentType")
        if other:
            raise DeploymentError(
                f"DynamoGraphDeployment {ref}: no service has subComponentType "
                f"'{sub_component_type}', and service '{legacy}' (the {backend} legacy name) "
                f"has subComponentType '{other}'"
            )
        return legacy, "legacy name"
    raise DeploymentError(
        f"DynamoGraphDeployment {ref} has no service with subComponentType "
        f"'{sub_component_type}' and no service named '{legacy}' (the {backend} legacy name); "
        f"services: {sorted(services)}"
    )


def service_gpus(service: Mapping[str, Any], name: str, ref: str) -> int | None:
    """GPUs per replica from ``resources.limits.gpu``, else ``requests.gpu``; None if absent."""
    resources = service.get("resources")
    if not isinstance(resources, Mapping):
        return None
    for kind in ("limits", "requests"):
        section = resources.get(kind)
        raw = section.get("gpu") if isinstance(section, Mapping) else None
        if raw is None or raw == "":
            continue
        try:
            value = int(str(raw).strip())
        except ValueError:
            raise DeploymentError(
                f"DynamoGraphDeployment {ref}: spec.services.{name}.resources.{kind}.gpu = "
                f"{raw!r}, expected a whole number of GPUs"
            ) from None
        if value < 0:
            raise DeploymentError(
                f"DynamoGraphDeployment {ref}: spec.services.{name}.resources.{kind}.gpu = "
                f"{raw!r}, expected >= 0"
            )
        # 0 GPUs (a CPU mocker) says nothing about engine size: let the config decide.
        return value or None
    return None


def main_container_tokens(service: Mapping[str, Any]) -> list[str]:
    """The words of the main container's command and args (shell-split), [] without one."""
    pod = service.get("extraPodSpec")
    container = pod.get("mainContainer") if isinstance(pod, Mapping) else None
    if not isinstance(container, Mapping):
        return []
    tokens: list[str] = []
    for key in ("command", "args"):
        parts = container.get(key) or []
        if isinstance(parts, str):
            parts = [parts]
        for part in parts:
            if not isinstance(part, str):
                continue
            try:
                tokens.extend(shlex.split(part))
            except ValueError:  # unbalanced quotes: still try the plain words
                tokens.extend(part.split())
    return tokens


def flag_value(tokens: list[str], flags: tuple[str, ...]) -> str | None:
    """The value of the first of ``flags`` on a command line (``--f v`` or ``--f=v``)."""
    for flag in flags:
        for i, token in enumerate(tokens):
            if token == flag and i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                return tokens[i + 1]
            if token.startswith(flag + "="):
                value = token.split("=", 1)[1]
                if value:
                    return value
    return None


def service_model_name(service: Mapping[str, Any]) -> str | None:
    """Served model name from the main container's command line (lower case), or None."""
    value = flag_value(main_container_tokens(service), MODEL_NAME_FLAGS)
    return value.lower() if value else None


def replicas_of(value: Any, where: str) -> int:
    if value is None:
        return 1  # the Dynamo operator's default for a service without replicas
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DeploymentError(f"{where} = {value!r}, expected an integer >= 0")
    return value


def _status_count(dgd: Mapping[str, Any], service: str, keys: tuple[str, ...]) -> int:
    """The first of ``keys`` the service's status entry has as an integer, else 0."""
    status = dgd.get("status")
    services = status.get("services") if isinstance(status, Mapping) else None
    entry = services.get(service) if isinstance(services, Mapping) else None
    if not isinstance(entry, Mapping):
        return 0
    for key in keys:
        value = entry.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


def ready_count(dgd: Mapping[str, Any], service: str) -> int:
    """``availableReplicas`` of the service's status, else ``readyReplicas``, else 0."""
    return _status_count(dgd, service, ("availableReplicas", "readyReplicas"))


def running_count(dgd: Mapping[str, Any], service: str) -> int:
    """The service's replicas that exist, ready or not: the status' ``replicas`` (Dynamo's
    "non-terminated replicas"), else its ready count."""
    return _status_count(dgd, service, ("replicas", "availableReplicas", "readyReplicas"))


def services_stable(dgd: Mapping[str, Any], ref: str) -> bool:
    """Every service except the planner runs its desired replicas, all updated."""
    status = dgd.get("status")
    reported = status.get("services") if isinstance(status, Mapping) else None
    if not isinstance(reported, Mapping):
        return False
    for name, service in dgd_services(dgd, ref).items():
        # The planner may itself be a service of the graph: waiting on it would deadlock.
        if service.get("componentType") == "planner":
            continue
        desired = replicas_of(service.get("replicas"), f"spec.services.{name}.replicas")
        entry = reported.get(name)
        if not isinstance(entry, Mapping):
            return False
        updated = entry.get("updatedReplicas")
        if ready_count(dgd, name) != desired or (updated is not None and updated != desired):
            return False
    return True
