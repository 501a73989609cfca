"""Dynamo's custom resources as the tests' kmock API servers declare them (one definition for
the connector tests and the end-to-end kmock server)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import kmock

GROUP = "nvidia.com"
VERSION = "v1alpha1"
DGD_PLURAL = "dynamographdeployments"
DGDSA_PLURAL = "dynamographdeploymentscalingadapters"
DWM_PLURAL = "dynamoworkermetadatas"
DGD = f"{GROUP}/{VERSION}/{DGD_PLURAL}"
DGDSA = f"{GROUP}/{VERSION}/{DGDSA_PLURAL}"
DWM = f"{GROUP}/{VERSION}/{DWM_PLURAL}"


def declare_dynamo_resources(resources: Any, *, verbs: Iterable[str]) -> None:
    """Declare DynamoGraphDeployment, its scaling adapter (with ``/scale``) and the workers'
    DynamoWorkerMetadata (Dynamo's Kubernetes discovery) on ``resources`` (a kmock
    emulator's ``resources``)."""
    resources[DGD] = kmock.ResourceInfo(
        kind="DynamoGraphDeployment",
        singular="dynamographdeployment",
        namespaced=True,
        verbs=set(verbs),
        shortnames={"dgd"},
        subresources={"status"},
    )
    resources[DGDSA] = kmock.ResourceInfo(
        kind="DynamoGraphDeploymentScalingAdapter",
        singular="dynamographdeploymentscalingadapter",
        namespaced=True,
        verbs=set(verbs),
        shortnames={"dgdsa"},
        subresources={"status", "scale"},
    )
    resources[DWM] = kmock.ResourceInfo(
        kind="DynamoWorkerMetadata",
        singular="dynamoworkermetadata",
        namespaced=True,
        verbs=set(verbs),
    )
