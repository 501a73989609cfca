"""The shape of a DynamoGraphDeployment: pure rules over the DGD object that find the service
of a role and read its GPUs, model, replicas and readiness, in either of the versions Dynamo
serves.

- ``nvidia.com/v1alpha1``: ``spec.services`` maps a service name to ``{componentType,
  subComponentType, replicas, resources.limits.gpu, extraPodSpec.mainContainer}``; the status
  per service is under ``status.services``.
- ``nvidia.com/v1beta1`` (Dynamo's storage version since the conversion webhook): the list
  ``spec.components`` of ``{name, type, replicas, podTemplate}``, ``type`` being
  ``prefill``/``decode`` for a disaggregated worker; GPUs are the main container's
  (``podTemplate.spec.containers[name=main].resources``, ``nvidia.com/gpu``); the status per
  component is under ``status.components`` (same fields as v1alpha1's).

Both read as one view, ``name -> service`` (:func:`dgd_services`); the writes differ (a merge
patch cannot change one element of a list: :func:`replicas_patch`).

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


V1ALPHA1 = "v1alpha1"
V1BETA1 = "v1beta1"
DGD_VERSIONS = (V1ALPHA1, V1BETA1)
# The container of a v1beta1 podTemplate that runs the engine (Dynamo's MainContainerName).
MAIN_CONTAINER = "main"
# Component types that name the sub-role themselves (v1beta1's ``type``; v1alpha1 accepts them
# as ``componentType`` too).
SUB_ROLE_TYPES = frozenset({"prefill", "decode"})


def dgd_version(dgd: Mapping[str, Any]) -> str:
    """``v1beta1`` or ``v1alpha1``: the object's ``apiVersion`` when it names one of them, else
    its shape (``spec.components`` is v1beta1's)."""
    api_version = dgd.get("apiVersion")
    if isinstance(api_version, str) and "/" in api_version:
        version = api_version.rsplit("/", 1)[1]
        if version in DGD_VERSIONS:
            return version
    spec = dgd.get("spec")
    if isinstance(spec, Mapping) and "components" in spec and "services" not in spec:
        return V1BETA1
    return V1ALPHA1


def written_version(dgd: Mapping[str, Any]) -> str | None:
    """The DGD version the object's spec was first written in: the ``apiVersion`` of its first
    ``managedFields`` entry that owns ``spec`` fields (the API server records each writer's
    version there), None when none names one of :data:`DGD_VERSIONS`."""
    entries = (dgd.get("metadata") or {}).get("managedFields")
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, Mapping):
            continue
        fields_v1 = entry.get("fieldsV1")
        api_version = entry.get("apiVersion")
        if not isinstance(fields_v1, Mapping) or "f:spec" not in fields_v1:
            continue
        if isinstance(api_version, str) and api_version.rsplit("/", 1)[-1] in DGD_VERSIONS:
            return api_version.rsplit("/", 1)[-1]
    return None


def service_path(dgd: Mapping[str, Any], name: str) -> str:
    """Where a service lives in the object, for messages: ``spec.services.<name>`` or
    ``spec.components[name=<name>]``."""
    if dgd_version(dgd) == V1BETA1:
        return f"spec.components[name={name}]"
    return f"spec.services.{name}"


def dgd_services(dgd: Mapping[str, Any], ref: str) -> Mapping[str, Mapping[str, Any]]:
    """The services of a DGD by name: ``spec.services`` of a v1alpha1 object, the entries of
    ``spec.components`` by their ``name`` for a v1beta1 one; checked to be maps."""
    spec = dgd.get("spec")
    if dgd_version(dgd) == V1BETA1:
        return _components(spec, ref)
    services = spec.get("services") if isinstance(spec, Mapping) else None
    if not isinstance(services, Mapping):
        raise DeploymentError(
            f"DynamoGraphDeployment {ref} has no spec.services map (a v1alpha1 object) and no "
            "spec.components list (a v1beta1 object)"
        )
    for name, service in services.items():
        if not isinstance(service, Mapping):
            raise DeploymentError(
                f"DynamoGraphDeployment {ref}: spec.services.{name} is "
                f"{type(service).__name__}, expected a map"
            )
    return services


def _components(spec: Any, ref: str) -> Mapping[str, Mapping[str, Any]]:
    components = spec.get("components") if isinstance(spec, Mapping) else None
    if not isinstance(components, list):
        raise DeploymentError(
            f"DynamoGraphDeployment {ref} (v1beta1) has no spec.components list, got "
            f"{type(components).__name__}"
        )
    by_name: dict[str, Mapping[str, Any]] = {}
    for i, component in enumerate(components):
        name = component.get("name") if isinstance(component, Mapping) else None
        if not isinstance(component, Mapping) or not isinstance(name, str) or not name:
            raise DeploymentError(
                f"DynamoGraphDeployment {ref}: spec.components[{i}] is not a map with a "
                "non-empty name"
            )
        if name in by_name:
            raise DeploymentError(
                f"DynamoGraphDeployment {ref}: two entries of spec.components are named '{name}'"
            )
        by_name[name] = component
    return by_name


def component_index(dgd: Mapping[str, Any], name: str, ref: str) -> int:
    """The position of component ``name`` in a v1beta1 object's ``spec.components``."""
    components = (dgd.get("spec") or {}).get("components") or []
    for i, component in enumerate(components):
        if isinstance(component, Mapping) and component.get("name") == name:
            return i
    raise DeploymentError(f"DynamoGraphDeployment {ref} has no component named '{name}'")


def sub_component_of(service: Mapping[str, Any]) -> str | None:
    """The sub-role a service declares: ``subComponentType``, else a component type that is a
    sub-role itself (v1beta1's ``type: prefill``, v1alpha1's ``componentType: decode``)."""
    sub = service.get("subComponentType")
    if isinstance(sub, str) and sub:
        return sub
    for key in ("type", "componentType"):
        kind = service.get(key)
        if kind in SUB_ROLE_TYPES:
            return str(kind)
    return None


def component_type(service: Mapping[str, Any]) -> str | None:
    """``componentType`` (v1alpha1) or ``type`` (v1beta1)."""
    kind = service.get("componentType", service.get("type"))
    return kind if isinstance(kind, str) else None


def resolve_service(
    services: Mapping[str, Mapping[str, Any]], sub_component_type: str, backend: str, ref: str
) -> tuple[str, str]:
    """The service name for ``sub_component_type`` and how it matched.

    By ``subComponentType`` first; the backend's legacy name only for a service that has no
    ``subComponentType``. Raises DeploymentError for duplicates or no match.
    """
    matches = sorted(
        name for name, svc in services.items() if sub_component_of(svc) == sub_component_type
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
        other = sub_component_of(legacy_service)
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


def main_container(service: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The engine's container: v1alpha1's ``extraPodSpec.mainContainer``, v1beta1's
    ``podTemplate.spec.containers`` entry named ``main``; None without one."""
    template = service.get("podTemplate")
    if isinstance(template, Mapping):
        pod = template.get("spec")
        containers = pod.get("containers") if isinstance(pod, Mapping) else None
        for container in containers if isinstance(containers, list) else ():
            if isinstance(container, Mapping) and container.get("name") == MAIN_CONTAINER:
                return container
        return None
    pod = service.get("extraPodSpec")
    container = pod.get("mainContainer") if isinstance(pod, Mapping) else None
    return container if isinstance(container, Mapping) else None


def _gpu_resources(service: Mapping[str, Any]) -> tuple[Mapping[str, Any] | None, str]:
    """(the resources that carry a service's GPUs, their path): v1alpha1's service-level
    ``resources`` (key ``gpu``), else the main container's (``nvidia.com/gpu``)."""
    resources = service.get("resources")
    if isinstance(resources, Mapping):
        return resources, "resources"
    container = main_container(service)
    resources = container.get("resources") if container is not None else None
    if isinstance(resources, Mapping):
        where = "podTemplate.spec.containers[main].resources"
        if "podTemplate" not in service:
            where = "extraPodSpec.mainContainer.resources"
        return resources, where
    return None, ""


def _gpu_key(section: Mapping[str, Any]) -> str | None:
    """The GPU entry of a resource list: ``gpu`` (v1alpha1) or an extended resource named
    ``<vendor>/gpu`` (``nvidia.com/gpu``)."""
    for key in section:
        if isinstance(key, str) and (key == "gpu" or key.endswith("/gpu")):
            return key
    return None


def service_gpus(service: Mapping[str, Any], name: str, ref: str) -> int | None:
    """GPUs per replica from the service's limits, else its requests (``resources.*.gpu`` in
    v1alpha1, the main container's ``nvidia.com/gpu`` in v1beta1); None if absent."""
    resources, where = _gpu_resources(service)
    if resources is None:
        return None
    # A v1beta1 component carries its own name; a v1alpha1 service is keyed by it.
    v1beta1 = service.get("name") == name
    path = f"spec.components[name={name}]" if v1beta1 else f"spec.services.{name}"
    for kind in ("limits", "requests"):
        section = resources.get(kind)
        key = _gpu_key(section) if isinstance(section, Mapping) else None
        raw = section.get(key) if key is not None and isinstance(section, Mapping) else None
        if raw is None or raw == "":
            continue
        field = f"{path}.{where}.{kind}.{key}"
        try:
            value = int(str(raw).strip())
        except ValueError:
            raise DeploymentError(
                f"DynamoGraphDeployment {ref}: {field} = {raw!r}, expected a whole number of GPUs"
            ) from None
        if value < 0:
            raise DeploymentError(f"DynamoGraphDeployment {ref}: {field} = {raw!r}, expected >= 0")
        # 0 GPUs (a CPU mocker) says nothing about engine size: let the config decide.
        return value or None
    return None


def pods_per_replica(service: Mapping[str, Any]) -> int:
    """Pods of one replica: ``multinode.nodeCount`` of a multinode service (a leader and its
    workers, each with the main container's GPUs), else 1."""
    multinode = service.get("multinode")
    count = multinode.get("nodeCount") if isinstance(multinode, Mapping) else None
    if isinstance(count, int) and not isinstance(count, bool) and count >= 1:
        return count
    return 1


def _pod_spec(service: Mapping[str, Any]) -> Mapping[str, Any]:
    """The pod spec the main container runs in: v1beta1's ``podTemplate.spec``, v1alpha1's
    ``extraPodSpec`` (a PodSpec with the ``mainContainer`` beside it)."""
    template = service.get("podTemplate")
    pod = template.get("spec") if isinstance(template, Mapping) else service.get("extraPodSpec")
    return pod if isinstance(pod, Mapping) else {}


def gpu_claim_templates(service: Mapping[str, Any], name: str, ref: str) -> list[str]:
    """The ResourceClaimTemplates (DRA) the main container's ``resources.claims`` use: each
    claim name looked up in the pod's ``resourceClaims``. A claim of a pre-made
    ResourceClaim (``resourceClaimName``) is shared by every replica: its devices are not
    per replica, and the planner cannot count them (an error naming the setting to use)."""
    container = main_container(service) or {}
    resources = container.get("resources")
    claims = resources.get("claims") if isinstance(resources, Mapping) else None
    if not isinstance(claims, list) or not claims:
        return []
    pod_claims = {
        c.get("name"): c
        for c in _pod_spec(service).get("resourceClaims") or []
        if isinstance(c, Mapping)
    }
    templates = []
    for claim in claims:
        claim_name = claim.get("name") if isinstance(claim, Mapping) else None
        entry = pod_claims.get(claim_name)
        if entry is None:
            raise DeploymentError(
                f"DynamoGraphDeployment {ref}: service '{name}' claims {claim_name!r}, which its "
                "pod's resourceClaims do not declare"
            )
        template = entry.get("resourceClaimTemplateName")
        if isinstance(template, str) and template:
            templates.append(template)
        elif entry.get("resourceClaimName"):
            raise DeploymentError(
                f"DynamoGraphDeployment {ref}: service '{name}' claims the ResourceClaim "
                f"{entry['resourceClaimName']!r}, shared by all its replicas: its GPUs per "
                "replica are unknown; set prefill_engine_num_gpu / decode_engine_num_gpu"
            )
    return templates


def claim_template_gpus(template: Mapping[str, Any], name: str) -> int:
    """GPUs one claim from the ResourceClaimTemplate ``template`` allocates: the ``count`` of
    each device request whose device class is a GPU class (its name contains ``gpu``, as
    NVIDIA's DRA driver's ``gpu.nvidia.com``), in the ``resource.k8s.io/v1`` shape (the
    request under ``exactly``) or the v1beta1 one (flat). ``allocationMode: All`` and
    ``firstAvailable`` alternatives leave the count open: an error naming the setting to use.
    """
    where = f"ResourceClaimTemplate {name}"
    spec = (template.get("spec") or {}).get("spec") or {}
    requests = (spec.get("devices") or {}).get("requests") or []
    total = 0
    for i, request in enumerate(requests if isinstance(requests, list) else ()):
        if not isinstance(request, Mapping):
            continue
        if request.get("firstAvailable"):
            raise DeploymentError(
                f"{where}: spec.spec.devices.requests[{i}] offers firstAvailable alternatives: "
                "the GPUs per replica are not fixed; set prefill_engine_num_gpu / "
                "decode_engine_num_gpu"
            )
        exact = request.get("exactly")
        exact = exact if isinstance(exact, Mapping) else request
        device_class = str(exact.get("deviceClassName") or "")
        if "gpu" not in device_class.lower():
            continue
        mode = exact.get("allocationMode") or "ExactCount"
        if mode != "ExactCount":
            raise DeploymentError(
                f"{where}: spec.spec.devices.requests[{i}].allocationMode = {mode!r}: the GPUs "
                "per replica depend on the node; set prefill_engine_num_gpu / "
                "decode_engine_num_gpu"
            )
        count = exact.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise DeploymentError(
                f"{where}: spec.spec.devices.requests[{i}].count = {count!r}, expected an "
                "integer >= 1"
            )
        total += count
    return total


def main_container_tokens(service: Mapping[str, Any]) -> list[str]:
    """The words of the main container's command and args (shell-split), [] without one."""
    container = main_container(service)
    if container is None:
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


def _status_entries(dgd: Mapping[str, Any]) -> Mapping[str, Any]:
    """The status per service: ``status.services`` (v1alpha1) or ``status.components``
    (v1beta1, keyed by component name); empty without one."""
    status = dgd.get("status")
    if not isinstance(status, Mapping):
        return {}
    key = "components" if dgd_version(dgd) == V1BETA1 else "services"
    entries = status.get(key)
    return entries if isinstance(entries, Mapping) else {}


def _status_count(dgd: Mapping[str, Any], service: str, keys: tuple[str, ...]) -> int:
    """The first of ``keys`` the service's status entry has as an integer, else 0."""
    entry = _status_entries(dgd).get(service)
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
    reported = _status_entries(dgd)
    if not reported:
        return False
    for name, service in dgd_services(dgd, ref).items():
        # The planner may itself be a service of the graph: waiting on it would deadlock.
        if component_type(service) == "planner":
            continue
        desired = replicas_of(service.get("replicas"), f"{service_path(dgd, name)}.replicas")
        entry = reported.get(name)
        if not isinstance(entry, Mapping):
            return False
        updated = entry.get("updatedReplicas")
        if ready_count(dgd, name) != desired or (updated is not None and updated != desired):
            return False
    return True


MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def _pointer(token: str) -> str:
    """One JSON-pointer path token (RFC 6901: ``~`` -> ``~0``, ``/`` -> ``~1``)."""
    return token.replace("~", "~0").replace("/", "~1")


def replicas_patch(
    dgd: Mapping[str, Any],
    replicas: Mapping[str, int],
    annotations: Mapping[str, str],
    ref: str,
) -> tuple[str, Any]:
    """(content type, body) of the one patch that sets ``replicas`` (service -> count) and
    ``annotations`` on ``dgd``, touching nothing else.

    v1alpha1: a JSON merge patch (``spec.services`` is a map). v1beta1: ``spec.components`` is
    a list, which a merge patch would replace whole (dropping every other field of every
    component), so a JSON patch: per component a ``test`` that the entry at the index read is
    still that component (the patch fails instead of scaling another one if the list changed
    since), then an ``add`` of its ``replicas``.
    """
    if dgd_version(dgd) == V1ALPHA1:
        return MERGE_PATCH, {
            "metadata": {"annotations": dict(annotations)},
            "spec": {"services": {name: {"replicas": n} for name, n in replicas.items()}},
        }
    ops: list[dict[str, Any]] = []
    existing = (dgd.get("metadata") or {}).get("annotations")
    if isinstance(existing, Mapping):
        for key, value in annotations.items():
            ops.append(
                {"op": "add", "path": f"/metadata/annotations/{_pointer(key)}", "value": value}
            )
    elif annotations:
        # No annotations yet: the map is created (an "add" below a missing member fails).
        ops.append({"op": "add", "path": "/metadata/annotations", "value": dict(annotations)})
    for name, count in replicas.items():
        i = component_index(dgd, name, ref)
        ops.append({"op": "test", "path": f"/spec/components/{i}/name", "value": name})
        ops.append({"op": "add", "path": f"/spec/components/{i}/replicas", "value": count})
    return JSON_PATCH, ops
