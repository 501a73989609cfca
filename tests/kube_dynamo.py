"""Dynamo's custom resources as the tests' kmock API servers declare them (one definition for
the connector tests and the end-to-end kmock server)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import kmock

GROUP = "nvidia.com"
VERSION = "v1alpha1"
BETA = "v1beta1"  # Dynamo's storage version; both are served, converted by its webhook
DGD_PLURAL = "dynamographdeployments"
DGDSA_PLURAL = "dynamographdeploymentscalingadapters"
DWM_PLURAL = "dynamoworkermetadatas"
DGD = f"{GROUP}/{VERSION}/{DGD_PLURAL}"
DGDSA = f"{GROUP}/{VERSION}/{DGDSA_PLURAL}"
DWM = f"{GROUP}/{VERSION}/{DWM_PLURAL}"


def declare_dynamo_resources(
    resources: Any, *, verbs: Iterable[str], versions: Iterable[str] = (VERSION,)
) -> None:
    """Declare DynamoGraphDeployment and its scaling adapter (with ``/scale``) in each of
    ``versions``, and the workers' DynamoWorkerMetadata (Dynamo's Kubernetes discovery), on
    ``resources`` (a kmock emulator's ``resources``). kmock converts nothing: an object
    stored under one version is seen only through that version."""
    for version in versions:
        _declare_graph(resources, verbs=verbs, version=version)
    resources[DWM] = kmock.ResourceInfo(
        kind="DynamoWorkerMetadata",
        singular="dynamoworkermetadata",
        namespaced=True,
        verbs=set(verbs),
    )


def _declare_graph(resources: Any, *, verbs: Iterable[str], version: str) -> None:
    resources[f"{GROUP}/{version}/{DGD_PLURAL}"] = kmock.ResourceInfo(
        kind="DynamoGraphDeployment",
        singular="dynamographdeployment",
        namespaced=True,
        verbs=set(verbs),
        shortnames={"dgd"},
        subresources={"status"},
    )
    resources[f"{GROUP}/{version}/{DGDSA_PLURAL}"] = kmock.ResourceInfo(
        kind="DynamoGraphDeploymentScalingAdapter",
        singular="dynamographdeploymentscalingadapter",
        namespaced=True,
        verbs=set(verbs),
        shortnames={"dgdsa"},
        subresources={"status", "scale"},
    )
