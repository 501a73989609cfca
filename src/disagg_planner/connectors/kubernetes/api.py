"""The Kubernetes API calls of the DGD connector, with its one bounded, logged retry.

Every call runs the sync ``kubernetes`` client in a worker thread. 409, 429, 5xx and
connection failures are retried with exponential backoff (a 429's ``Retry-After`` first),
then reported as :class:`ConnectorError`; 404 is a :class:`DeploymentError` unless the caller
allows it (an adapter that does not exist); 401/403 and other 4xx are :class:`ConnectorError`
at once (403 names the missing permission). The table of calls is in the package docstring.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from disagg_planner.connectors.dgd_shape import (
    DGD_VERSIONS,
    MERGE_PATCH,
    V1ALPHA1,
    V1BETA1,
    written_version,
)
from disagg_planner.errors import ConnectorError, DeploymentError

log = logging.getLogger(__name__)

DGD_GROUP = "nvidia.com"
# The version a caller names when it has no DGD to ask (fixtures, Events before a read).
DGD_VERSION = V1ALPHA1
DGD_KIND = "DynamoGraphDeployment"
# Dynamic resource allocation: the templates of the GPU claims a DGD's pods may make.
DRA_GROUP = "resource.k8s.io"
DRA_VERSIONS = ("v1", "v1beta2", "v1beta1")  # newest first (v1 since Kubernetes 1.34)
CLAIM_TEMPLATES = "resourceclaimtemplates"
DGD_PLURAL = "dynamographdeployments"
DGDSA_PLURAL = "dynamographdeploymentscalingadapters"
# The labels the Dynamo operator puts on the pods of a DGD's service.
DGD_POD_LABEL = "nvidia.com/dynamo-graph-deployment-name"
SERVICE_POD_LABEL = "nvidia.com/dynamo-component"

# The service-account namespace file of an in-cluster pod.
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
MAX_BACKOFF_S = 30.0
# Connector and Prometheus calls are blocking HTTP run in threads; the operator runs this many
# (asyncio's default pool, CPUs + 4, would let a few slow API servers stall every other
# DGD's tick), and the API client's connection pool is sized to match.
API_WORKER_THREADS = 64


class _Retryable(Exception):
    """An API answer worth another attempt; ``delay_s`` overrides the backoff when set."""

    def __init__(self, detail: str, delay_s: float | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.delay_s = delay_s


def default_namespace() -> str:
    """The pod's own namespace (its service account's), else ``default``."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def planner_api_client(
    configuration: k8s_client.Configuration, *, pool_size: int = API_WORKER_THREADS
) -> k8s_client.ApiClient:
    """An API client for ``configuration`` as the planner uses it.

    urllib3's own retries are off (``retries=False``): the client's default ``Retry(3)``
    honours ``Retry-After`` and repeats a request up to 4 times under one attempt of
    :meth:`DgdApi.call`, unlogged and unbounded by ``kubernetes_api_max_attempts``, so that
    each logged attempt is exactly one HTTP request. The connection pool holds
    ``pool_size`` connections (the worker threads that call through it): a smaller pool
    discards a connection each time more threads call at once, a new TLS handshake each.
    """
    configuration.retries = False
    configuration.connection_pool_maxsize = pool_size
    return k8s_client.ApiClient(configuration)


def default_api_client(*, pool_size: int = API_WORKER_THREADS) -> k8s_client.ApiClient:
    """An API client from the in-cluster service account, else the kubeconfig."""
    configuration = k8s_client.Configuration()
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)
    except ConfigException:
        try:
            # The client captures $KUBECONFIG when it is imported; read it now instead.
            k8s_config.load_kube_config(
                config_file=os.environ.get("KUBECONFIG") or None,
                client_configuration=configuration,
            )
        except (ConfigException, OSError) as exc:
            raise ConnectorError(
                "cannot reach Kubernetes: not running in a pod with a service account, and no "
                f"usable kubeconfig ($KUBECONFIG or ~/.kube/config): {exc}"
            ) from exc
    return planner_api_client(configuration, pool_size=pool_size)


def server_message(exc: ApiException) -> str:
    """The message of an API server's error answer (its Status object), else its text."""
    try:
        body = json.loads(exc.body or "")
    except ValueError:
        return (exc.body or exc.reason or "").strip()[:300]
    if isinstance(body, Mapping) and body.get("message"):
        return str(body["message"])
    return str(exc.reason or "")


def retry_after(exc: ApiException) -> float | None:
    """A 429's ``Retry-After`` in seconds, when it is a finite, non-negative number."""
    headers = exc.headers or {}
    raw = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        value = float(raw) if raw is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) and value >= 0 else None


class _ServedVersions:
    """The served DGD versions of one API server, shared by all its connectors: one lookup
    at a time (callers that come while it runs wait for its answer), kept until a caller
    finds it out of date. A failed lookup is not kept: the next caller tries again."""

    def __init__(self) -> None:
        self.served: list[str] | None = None
        self._lookup: asyncio.Task[list[str]] | None = None

    async def get(
        self, discover: Callable[[], Coroutine[Any, Any, list[str]]], *, stale: list[str] | None
    ) -> list[str]:
        if self.served is not None and (stale is None or self.served is not stale):
            return self.served
        lookup = self._lookup
        if lookup is None or lookup.done() or lookup.get_loop() is not asyncio.get_running_loop():
            lookup = self._lookup = asyncio.get_running_loop().create_task(discover())
        try:
            # shielded: one caller cancelled (its loop stopping) does not fail the others
            served = await asyncio.shield(lookup)
        finally:
            if lookup.done() and self._lookup is lookup:
                self._lookup = None
        # None served (Dynamo's CRDs not installed yet) is not kept: looked up again each time
        self.served = served or None
        return served


# Per API client (one per cluster in a process); weak, so a closed client's entry goes too.
_SERVED: weakref.WeakKeyDictionary[k8s_client.ApiClient, _ServedVersions] = (
    weakref.WeakKeyDictionary()
)


class DgdApi:
    """The calls on one DGD, its scaling adapters and its pods, each retried the same way.

    ``sleep`` is injectable for tests (the backoff between attempts).
    """

    def __init__(
        self,
        api_client: k8s_client.ApiClient,
        *,
        namespace: str,
        dgd_name: str,
        max_attempts: int,
        timeout_s: float,
        backoff_s: float,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.namespace = namespace
        self.dgd_name = dgd_name
        self.ref = f"{namespace}/{dgd_name}"
        self._custom = k8s_client.CustomObjectsApi(api_client)
        self.core = k8s_client.CoreV1Api(api_client)
        self._max_attempts = max_attempts
        self._timeout_s = timeout_s
        self._backoff_s = backoff_s
        self._sleep = sleep
        self._api_client = api_client
        # The DGD version this connector reads and writes; None until resolve_version().
        self.version: str | None = None
        # The served versions it was chosen among (what a 404 on it shows out of date).
        self._resolved_from: list[str] | None = None

    async def served_versions(self, *, stale: list[str] | None = None) -> list[str]:
        """The versions of ``dynamographdeployments.nvidia.com`` the API server serves (its
        discovery documents), in :data:`DGD_VERSIONS` order.

        Looked up once for every connector on the same API client (:class:`_ServedVersions`):
        a thousand connectors starting together make one lookup, not two requests each.
        ``stale``: the list a caller found out of date (its version answered 404); it is looked
        up again unless another caller has already done so."""
        shared = _SERVED.get(self._api_client)
        if shared is None:
            shared = _SERVED[self._api_client] = _ServedVersions()
        return await shared.get(self._discover, stale=stale)

    async def _discover(self) -> list[str]:
        served = []
        for version in DGD_VERSIONS:
            answer = await self.call(
                f"discover {DGD_GROUP}/{version}",
                "get",
                "API discovery",
                self._custom.get_api_resources,
                DGD_GROUP,
                version,
                allow_404=True,
            )
            resources = getattr(answer, "resources", None) or ()
            if any(getattr(r, "name", None) == DGD_PLURAL for r in resources):
                served.append(version)
        return served

    async def resolve_version(self) -> str:
        """The DGD version to use: the only one served, else the one the object was written
        in (its first writer's ``managedFields`` entry), else v1beta1, Dynamo's storage
        version (the server converts either way; reading in the version the user wrote keeps
        our writes in the fields they know)."""
        if self.version is not None:
            return self.version
        served = await self.served_versions()
        if not served:
            raise DeploymentError(
                f"DynamoGraphDeployment {self.ref}: the API server serves no version of "
                f"{DGD_PLURAL}.{DGD_GROUP} ({', '.join(DGD_VERSIONS)}); are Dynamo's CRDs "
                "installed?"
            )
        version = served[0]
        if len(served) > 1:
            # A DGD not applied yet has no writer: v1beta1 then (both show the same object).
            dgd = await self._get_dgd(V1BETA1, allow_missing=True)
            written = written_version(dgd) if dgd is not None else None
            version = written if written in served else V1BETA1
        log.info(
            "DGD %s: reading and writing %s/%s (served: %s)", self.ref, DGD_GROUP, version, served
        )
        self.version = version
        self._resolved_from = served
        return version

    async def get_dgd(self) -> Mapping[str, Any]:
        """The DGD, in the version :meth:`resolve_version` chose. A 404 there may be the
        version withdrawn (Dynamo upgraded, an old version no longer served) rather than the
        DGD gone: the served versions are looked up again and, when the version is no longer
        among them, the DGD is read in the one resolved afresh."""
        version = await self.resolve_version()
        try:
            dgd = await self._get_dgd(version)
        except DeploymentError:
            served = await self.served_versions(stale=self._resolved_from)
            if version in served:
                # the version is served: the DGD itself is missing (a next 404 looks again
                # unless another connector has by then)
                self._resolved_from = served
                raise
            log.warning(
                "DGD %s: %s/%s is no longer served (served: %s); resolving again",
                self.ref,
                DGD_GROUP,
                version,
                served,
            )
            self.version = None
            dgd = await self._get_dgd(await self.resolve_version())
        assert dgd is not None  # a 404 raised DeploymentError
        return dgd

    async def _get_dgd(
        self, version: str, *, allow_missing: bool = False
    ) -> Mapping[str, Any] | None:
        dgd = await self.call(
            f"get DynamoGraphDeployment {self.ref}",
            "get",
            DGD_PLURAL,
            self._custom.get_namespaced_custom_object,
            DGD_GROUP,
            version,
            self.namespace,
            DGD_PLURAL,
            self.dgd_name,
            allow_404=allow_missing,
        )
        if dgd is None and allow_missing:
            return None
        if not isinstance(dgd, Mapping):
            raise ConnectorError(f"get DynamoGraphDeployment {self.ref}: answer is not an object")
        return dgd

    async def get_adapter(self, adapter_name: str, service: str) -> Mapping[str, Any] | None:
        """The scaling adapter of ``service``, checked to refer to it; None when it has none."""
        adapter = await self.call(
            f"get DynamoGraphDeploymentScalingAdapter {self.namespace}/{adapter_name}",
            "get",
            DGDSA_PLURAL,
            self._custom.get_namespaced_custom_object,
            DGD_GROUP,
            await self.resolve_version(),
            self.namespace,
            DGDSA_PLURAL,
            adapter_name,
            allow_404=True,
        )
        if isinstance(adapter, Mapping):
            self.check_adapter(adapter, adapter_name, service)
            return adapter
        return None

    async def get_claim_template(self, name: str) -> Mapping[str, Any]:
        """The ResourceClaimTemplate ``name`` in the newest DRA version the server serves."""
        for version in DRA_VERSIONS:
            template = await self.call(
                f"get ResourceClaimTemplate {self.namespace}/{name} ({DRA_GROUP}/{version})",
                "get",
                CLAIM_TEMPLATES,
                self._custom.get_namespaced_custom_object,
                DRA_GROUP,
                version,
                self.namespace,
                CLAIM_TEMPLATES,
                name,
                allow_404=True,
            )
            if isinstance(template, Mapping):
                return template
        raise DeploymentError(
            f"ResourceClaimTemplate {self.namespace}/{name}, which DynamoGraphDeployment "
            f"{self.ref} claims GPUs from, was not found ({DRA_GROUP} {', '.join(DRA_VERSIONS)})"
        )

    def check_adapter(self, adapter: Mapping[str, Any], adapter_name: str, service: str) -> None:
        """Refuse an adapter that refers to another DGD or service."""
        ref = (adapter.get("spec") or {}).get("dgdRef") or {}
        if not isinstance(ref, Mapping):
            return
        # v1alpha1 names the service serviceName, v1beta1 componentName.
        target = ref.get("serviceName", ref.get("componentName"))
        if ref.get("name") not in (None, self.dgd_name) or target not in (None, service):
            raise DeploymentError(
                f"DynamoGraphDeploymentScalingAdapter {self.namespace}/{adapter_name} refers to "
                f"{ref.get('name')}/{target}, expected "
                f"{self.dgd_name}/{service}: refusing to scale through it"
            )

    async def dgd_pods(self) -> list[Any]:
        """The pods of this DGD (``V1Pod``), by Dynamo's label."""
        pods = await self.call(
            f"list pods of DynamoGraphDeployment {self.ref}",
            "list",
            "pods",
            self.core.list_namespaced_pod,
            self.namespace,
            label_selector=f"{DGD_POD_LABEL}={self.dgd_name}",
        )
        # Checked here too: the selector is the server's to apply, the budget ours.
        return [
            pod
            for pod in getattr(pods, "items", None) or ()
            if (pod.metadata.labels or {}).get(DGD_POD_LABEL) == self.dgd_name
        ]

    async def annotate_pod(self, name: str, annotations: Mapping[str, str | None]) -> None:
        """One merge patch of a pod's annotations (None removes one)."""
        await self.call(
            f"patch pod {self.namespace}/{name} (pod-deletion-cost)",
            "patch",
            "pods",
            self.core.patch_namespaced_pod,
            name,
            self.namespace,
            {"metadata": {"annotations": dict(annotations)}},
            _content_type="application/merge-patch+json",
        )

    async def terminating_pods(self) -> dict[str, int]:
        """Pods of this DGD still terminating, by service (they hold their GPUs until gone)."""
        counts: dict[str, int] = {}
        for pod in await self.dgd_pods():
            labels = pod.metadata.labels or {}
            if pod.metadata.deletion_timestamp is None:
                continue
            if pod.status is not None and pod.status.phase in ("Succeeded", "Failed"):
                continue  # exited: its GPUs are free
            service = labels.get(SERVICE_POD_LABEL, "")
            counts[service] = counts.get(service, 0) + 1
        return counts

    async def patch_adapter_scale(self, adapter_name: str, replicas: int) -> Any:
        """Set an adapter's replicas through ``/scale``; returns the server's answer."""
        return await self.call(
            f"patch scale of DynamoGraphDeploymentScalingAdapter {self.namespace}/{adapter_name}",
            "patch",
            f"{DGDSA_PLURAL}/scale",
            self._custom.patch_namespaced_custom_object_scale,
            DGD_GROUP,
            await self.resolve_version(),
            self.namespace,
            DGDSA_PLURAL,
            adapter_name,
            {"spec": {"replicas": replicas}},
            _content_type="application/merge-patch+json",
        )

    async def patch_dgd(
        self, body: Any, *, what: str | None = None, content_type: str = MERGE_PATCH
    ) -> Any:
        """One patch of the DGD (a JSON merge patch unless ``content_type`` says otherwise);
        ``what`` names the change in errors; returns the patched object."""
        return await self.call(
            f"patch DynamoGraphDeployment {self.ref}" + (f" ({what})" if what else ""),
            "patch",
            DGD_PLURAL,
            self._custom.patch_namespaced_custom_object,
            DGD_GROUP,
            await self.resolve_version(),
            self.namespace,
            DGD_PLURAL,
            self.dgd_name,
            body,
            _content_type=content_type,
        )

    async def call(
        self,
        what: str,
        verb: str,
        resource: str,
        fn: Callable[..., Any],
        *args: Any,
        allow_404: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Run one API call in a thread, retrying 409/429/5xx/connection failures.

        Returns None on 404 when ``allow_404``. Raises DeploymentError (404) or
        ConnectorError (everything else) with ``what`` and the server's message.
        """
        attempts = self._max_attempts
        last = ""
        for attempt in range(1, attempts + 1):
            try:
                try:
                    return await asyncio.to_thread(
                        fn, *args, _request_timeout=self._timeout_s, **kwargs
                    )
                except ApiException as exc:
                    self._classify(exc, what, verb, resource, allow_404=allow_404)
                    return None  # an allowed 404: _classify raised for everything else
                except (urllib3.exceptions.HTTPError, OSError) as exc:
                    raise _Retryable(f"connection failed: {exc}") from exc
            except _Retryable as retry:
                last = retry.detail
                if attempt == attempts:
                    break
                delay = retry.delay_s
                if delay is None:
                    delay = min(self._backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S)
                log.warning(
                    "%s: attempt %d/%d failed (%s); retrying in %.2f s",
                    what,
                    attempt,
                    attempts,
                    last,
                    delay,
                )
                await self._sleep(delay)
        raise ConnectorError(f"{what}: failed after {attempts} attempt(s); last: {last}")

    def _classify(
        self, exc: ApiException, what: str, verb: str, resource: str, *, allow_404: bool
    ) -> None:
        """Raise _Retryable for retryable answers, else the typed error; return only for an
        allowed 404."""
        status = exc.status or 0
        message = server_message(exc)
        answer = f"{status} {exc.reason or ''}".strip() + (f": {message}" if message else "")
        if status in (409, 429) or status >= 500:
            delay = retry_after(exc) if status == 429 else None
            raise _Retryable(answer, delay)
        if status == 404:
            if allow_404:
                return
            raise DeploymentError(
                f"{what}: not found ({answer}); check --dgd-name / DYN_PARENT_DGD_K8S_NAME and "
                f"--kubernetes-namespace, and that the {DGD_GROUP} CRDs are installed"
            )
        if status in (401, 403):
            raise ConnectorError(
                f"{what}: {'forbidden' if status == 403 else 'unauthorized'} ({answer}); the "
                f"planner's service account needs '{verb}' on '{resource}' in namespace "
                f"'{self.namespace}' (see the RBAC table in disagg_planner.connectors.kubernetes)"
            )
        raise ConnectorError(f"{what}: rejected ({answer})")
