"""Checks over rendered Kubernetes manifests: schema validation, RBAC rules as calls, and
static security rules.

The security rules are ours, not checkov's: checkov 3.x pins ``packaging<24`` (this project
resolves 26.x through its other dependencies) and pulls about fifty more packages (boto3,
docker, networkx<2.7 ...). The rules below cover what checkov's Kubernetes checks ask of a
controller Deployment and its RBAC: no privilege, no host access, a read-only root
filesystem, a non-root high UID, dropped capabilities, seccomp, requests and limits, a fixed
image tag, probes, a dedicated service account, no wildcard or escalating RBAC.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

import kubernetes_validate
import kubernetes_validate.utils as kv_utils

from tests.unit.deploy.api_calls import Call

# Oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schemas known.
KUBERNETES_VERSIONS = ("1.25.0", "1.37.0")
CUSTOM_KINDS = frozenset({"KopfPeering", "ClusterKopfPeering", "ServiceMonitor", "PodMonitor"})

# kubernetes-validate re-reads its (multi-megabyte) JSON schemas on every call.
kv_utils.schema_contents = functools.lru_cache(maxsize=None)(kv_utils.schema_contents)


# Kinds newer than the oldest supported Kubernetes (the chart renders them only where the API
# server serves them): validated from the version that made them GA.
FIRST_VERSION = {
    "ValidatingAdmissionPolicy": "1.30.0",
    "ValidatingAdmissionPolicyBinding": "1.30.0",
}


def validate_kubernetes(doc: Mapping[str, Any]) -> list[str]:
    """Errors of one built-in object against the Kubernetes schemas (strict: unknown fields
    are errors), for every version in KUBERNETES_VERSIONS (from its FIRST_VERSION on)."""
    errors = []
    versions = KUBERNETES_VERSIONS
    if doc.get("kind") in FIRST_VERSION:
        versions = (FIRST_VERSION[doc["kind"]], KUBERNETES_VERSIONS[-1])
    for version in versions:
        try:
            kubernetes_validate.validate(dict(doc), version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = "/".join(str(p) for p in exc.path)
            errors.append(f"{doc['kind']} {name_of(doc)} (k8s {version}) at {path}: {exc.message}")
    return errors


def name_of(doc: Mapping[str, Any]) -> str:
    meta = doc.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


def rule_calls(rules: Iterable[Mapping[str, Any]]) -> list[Call]:
    """The (verb, group, resource) triples a list of RBAC rules grants, with repeats."""
    out = []
    for rule in rules:
        for group in rule.get("apiGroups") or []:
            for resource in rule.get("resources") or []:
                for verb in rule.get("verbs") or []:
                    out.append((verb, group, resource))
    return out


# --- security rules ---------------------------------------------------------------------------

_DANGEROUS_VERBS = frozenset({"escalate", "bind", "impersonate"})
_SENSITIVE_RESOURCES = frozenset({"secrets", "pods/exec", "pods/attach", "serviceaccounts/token"})


def _pod_spec(doc: Mapping[str, Any]) -> Mapping[str, Any] | None:
    kind = doc.get("kind")
    if kind == "Pod":
        return doc.get("spec") or {}
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        return ((doc.get("spec") or {}).get("template") or {}).get("spec") or {}
    if kind == "CronJob":
        job = ((doc.get("spec") or {}).get("jobTemplate") or {}).get("spec") or {}
        return (job.get("template") or {}).get("spec") or {}
    return None


def security_findings(docs: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every violation of the rules below, as ``<object>: <rule>: <detail>``."""
    findings: list[str] = []
    for doc in docs:
        where = f"{doc.get('kind')} {name_of(doc)}"
        spec = _pod_spec(doc)
        if spec is not None:
            findings += [f"{where}: {f}" for f in _pod_findings(spec)]
        if doc.get("kind") in ("Role", "ClusterRole"):
            findings += [f"{where}: {f}" for f in _rbac_findings(doc.get("rules") or [])]
    return findings


def _pod_findings(spec: Mapping[str, Any]) -> list[str]:
    out = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            out.append(f"host namespace shared: {key} is true")
    for volume in spec.get("volumes") or []:
        if "hostPath" in volume:
            out.append(f"hostPath volume {volume.get('name')!r}")
    if spec.get("serviceAccountName") in (None, "", "default"):
        out.append("runs as the namespace's default service account")
    pod_ctx = spec.get("securityContext") or {}
    containers = list(spec.get("containers") or []) + list(spec.get("initContainers") or [])
    if not containers:
        out.append("no containers")
    for c in containers:
        name = f"container {c.get('name')!r}"
        ctx = c.get("securityContext") or {}

        def setting(key: str, ctx: Mapping[str, Any] = ctx) -> Any:
            return ctx.get(key, pod_ctx.get(key))

        if ctx.get("privileged"):
            out.append(f"{name}: privileged")
        if ctx.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation is not false")
        if ctx.get("readOnlyRootFilesystem") is not True:
            out.append(f"{name}: root filesystem is writable")
        if setting("runAsNonRoot") is not True:
            out.append(f"{name}: runAsNonRoot is not true")
        uid = setting("runAsUser")
        if uid is None or uid < 10000:
            out.append(f"{name}: runAsUser {uid} is not a high UID (>= 10000)")
        caps = ctx.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{name}: capabilities not dropped (drop: [ALL])")
        if caps.get("add"):
            out.append(f"{name}: capabilities added: {caps['add']}")
        seccomp = (ctx.get("seccompProfile") or pod_ctx.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccomp profile is {seccomp!r}")
        resources = c.get("resources") or {}
        for part, keys in (("requests", ("cpu", "memory")), ("limits", ("cpu", "memory"))):
            for key in keys:
                if key not in (resources.get(part) or {}):
                    out.append(f"{name}: no {part}.{key}")
        image = str(c.get("image") or "")
        tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else ""
        if "@sha256:" not in image and tag in ("", "latest"):
            out.append(f"{name}: image {image!r} has no fixed tag")
        for probe in ("livenessProbe", "readinessProbe"):
            if probe not in c:
                out.append(f"{name}: no {probe}")
        for port in c.get("ports") or []:
            if "hostPort" in port:
                out.append(f"{name}: hostPort {port['hostPort']}")
    return out


def _rbac_findings(rules: Iterable[Mapping[str, Any]]) -> list[str]:
    out = []
    for rule in rules:
        for key in ("apiGroups", "resources", "verbs"):
            if "*" in (rule.get(key) or []):
                out.append(f"wildcard in {key}: {rule}")
        if rule.get("nonResourceURLs"):
            out.append(f"non-resource URLs granted: {rule['nonResourceURLs']}")
    for verb, group, resource in rule_calls(rules):
        if verb in _DANGEROUS_VERBS:
            out.append(f"verb {verb} on {group}/{resource}")
        if group == "" and resource in _SENSITIVE_RESOURCES:
            out.append(f"access to {resource} ({verb})")
    return out
