"""Find every engine's ForwardPassMetrics publisher the way Dynamo's components find each
other on Kubernetes, and follow them with watches as workers come and go.

Dynamo's Kubernetes discovery (``DYN_DISCOVERY_BACKEND=kubernetes``, which its operator sets;
``lib/runtime/src/discovery/kube`` in Dynamo):

- every worker writes a ``DynamoWorkerMetadata`` (``nvidia.com/v1alpha1``,
  ``dynamoworkermetadatas``) in its namespace, named after its pod (``<pod>-<container>`` in
  container mode) and owned by the pod (``metadata.ownerReferences``, kind ``Pod``). Its
  ``spec.data.event_channels`` maps a key to ``{type: EventChannel, namespace, component,
  topic, instance_id, transport}``;
- a worker's FPM relay (``lib/llm/src/fpm_publisher.rs``) publishes the engine's reports on
  the event plane under the topic ``forward-pass-metrics``. With the ZMQ event plane
  (``DYN_EVENT_PLANE=zmq``) the channel's transport is ``{kind: Zmq, config: {endpoint:
  tcp://<pod-ip>:<port>}}``: the publisher this module finds. With NATS there is no socket to
  connect to; such channels are skipped (logged once each);
- a worker is discoverable only while its pod is ready. Dynamo reads readiness from
  EndpointSlices (pod mode) or from the Pods themselves (container mode); this module reads
  the Pods labelled ``nvidia.com/dynamo-graph-deployment-name=<dgd>``, which also carry the
  DGD service (``nvidia.com/dynamo-component``) that gives the worker's role.

A message on such a publisher is an event-plane message, ``[topic, publisher_id (8 bytes),
sequence (8 bytes), frame]``, where the frame is a version byte (1), a big-endian u32 length
and a msgpack ``EventEnvelope`` whose ``payload`` is the engine's FPM bytes;
:func:`event_plane_payload` unwraps it, and :class:`EventPlaneFpmSubscriber` is an
:class:`FpmSubscriber` that reads both that and the engines' raw ``[topic, sequence,
payload]``.

:class:`DiscoveredEngines` is the engine-source factory for the live loop: one subscriber per
role, whose endpoints follow :class:`FpmPublisherWatcher`; a role with a static endpoint list
in the config (``prefill_fpm_endpoints`` / ``decode_fpm_endpoints``) keeps that list instead
(the override) and is not discovered.

Kubernetes API calls this module makes (the Helm chart's RBAC; namespaced):

========  ==============  ========================  ==========================================
verb      API group       resource                  why
========  ==============  ========================  ==========================================
list      "" (core v1)    pods                      the workers' readiness and service
watch     "" (core v1)    pods                      ... as they come and go
list      nvidia.com      dynamoworkermetadatas     the workers' event channels
watch     nvidia.com      dynamoworkermetadatas     ... as they change
========  ==============  ========================  ==========================================
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec
import urllib3
from kubernetes import client as k8s_client
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.observe.fpm_subscriber import FpmSubscriber
from disagg_planner.signals.fpm import ForwardPassMetrics

log = logging.getLogger(__name__)

FPM_TOPIC = "forward-pass-metrics"
DWM_GROUP = "nvidia.com"
DWM_VERSION = "v1alpha1"
DWM_PLURAL = "dynamoworkermetadatas"
DGD_POD_LABEL = "nvidia.com/dynamo-graph-deployment-name"
SERVICE_POD_LABEL = "nvidia.com/dynamo-component"

FRAME_VERSION = 1
_FRAME_HEADER = struct.Struct(">BI")

Publishers = Mapping[str, frozenset[str]]
"""Role -> the ZMQ endpoints of its ready workers' FPM publishers."""


def requests_in_flight(fpm: ForwardPassMetrics) -> int:
    """Requests an engine holds: scheduled this iteration and queued."""
    scheduled, queued = fpm.scheduled_requests, fpm.queued_requests
    return (
        scheduled.num_prefill_requests
        + scheduled.num_decode_requests
        + queued.num_prefill_requests
        + queued.num_decode_requests
    )


# --- the event plane's wire format -------------------------------------------------------------


class _Envelope(msgspec.Struct):
    """Dynamo's ``EventEnvelope`` as its msgpack codec writes it (named fields)."""

    payload: bytes
    topic: str = ""


_ENVELOPE = msgspec.msgpack.Decoder(_Envelope)


def event_plane_payload(frames: list[bytes]) -> bytes | None:
    """The FPM bytes of an event-plane message, or None when ``frames`` is not one."""
    if len(frames) != 4 or len(frames[1]) != 8 or len(frames[2]) != 8:
        return None
    frame = frames[3]
    if len(frame) < _FRAME_HEADER.size:
        return None
    version, length = _FRAME_HEADER.unpack_from(frame)
    if version != FRAME_VERSION or len(frame) - _FRAME_HEADER.size != length:
        return None
    try:
        return _ENVELOPE.decode(frame[_FRAME_HEADER.size :]).payload
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


class EventPlaneFpmSubscriber(FpmSubscriber):
    """An :class:`FpmSubscriber` that also reads event-plane messages (Dynamo's FPM relay)."""

    def _handle(self, endpoint: str, frames: list[bytes]) -> None:
        payload = event_plane_payload(frames)
        # Not an event-plane message: an engine's own [topic, sequence, payload].
        super()._handle(endpoint, [payload] if payload is not None else frames)


# --- from the cluster's objects to publishers ------------------------------------------------


def _is_ready(pod: Mapping[str, Any]) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False  # terminating: Kubernetes takes it out of service
    status = pod.get("status") or {}
    conditions = status.get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _owner_pod(metadata: Mapping[str, Any]) -> str | None:
    """The pod a DynamoWorkerMetadata belongs to: its owner, else its own name (pod mode)."""
    meta = metadata.get("metadata") or {}
    for owner in meta.get("ownerReferences") or []:
        if owner.get("kind") == "Pod" and owner.get("name"):
            return str(owner["name"])
    name = meta.get("name")
    return str(name) if name else None


def fpm_channels(metadata: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(ZMQ endpoints, other transports' kinds) of a DynamoWorkerMetadata's FPM channels."""
    data = (metadata.get("spec") or {}).get("data") or {}
    channels = data.get("event_channels") or {}
    endpoints: list[str] = []
    others: list[str] = []
    for channel in channels.values() if isinstance(channels, Mapping) else ():
        if not isinstance(channel, Mapping) or channel.get("topic") != FPM_TOPIC:
            continue
        transport = channel.get("transport") or {}
        config = transport.get("config") or {}
        if transport.get("kind") == "Zmq" and isinstance(config.get("endpoint"), str):
            endpoints.append(config["endpoint"])
        else:
            others.append(str(transport.get("kind")))
    return endpoints, others


def publishers(
    pods: Iterable[Mapping[str, Any]],
    metadatas: Iterable[Mapping[str, Any]],
    service_roles: Mapping[str, str],
) -> dict[str, frozenset[str]]:
    """Role -> FPM endpoints of the workers that are ready (pod) and registered (metadata).

    ``service_roles`` maps a DGD service name to the role it carries; pods of other services
    (the frontend, the planner) are left out.
    """
    ready_role: dict[str, str] = {}
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        role = service_roles.get(labels.get(SERVICE_POD_LABEL, ""))
        name = (pod.get("metadata") or {}).get("name")
        if role is not None and name and _is_ready(pod):
            ready_role[str(name)] = role
    found: dict[str, set[str]] = {role: set() for role in service_roles.values()}
    for metadata in metadatas:
        pod_name = _owner_pod(metadata)
        role = ready_role.get(pod_name or "")
        if role is not None:
            found[role].update(fpm_channels(metadata)[0])
    return {role: frozenset(endpoints) for role, endpoints in found.items()}


# --- following them ----------------------------------------------------------------------------


class FpmPublisherWatcher:
    """Follows the Pods and DynamoWorkerMetadatas of one DGD and calls ``on_change`` with
    :func:`publishers` whenever the result changes (and once after the first complete read).

    Each kind is listed, then watched from that list; when a watch ends (the server's
    timeout, a dropped connection, a 410 Gone) it is listed again. Two daemon threads; the
    ``kubernetes`` client is synchronous. ``on_change`` runs on those threads.
    """

    def __init__(
        self,
        api_client: k8s_client.ApiClient,
        *,
        namespace: str,
        dgd_name: str,
        service_roles: Mapping[str, str],
        on_change: Callable[[Publishers], None],
        watch_timeout_s: int = 50,
        request_timeout_s: float = 60.0,
        retry_s: float = 2.0,
    ) -> None:
        self.namespace = namespace
        self.dgd_name = dgd_name
        self.service_roles = dict(service_roles)
        self._on_change = on_change
        self._core = k8s_client.CoreV1Api(api_client)
        self._custom = k8s_client.CustomObjectsApi(api_client)
        self._serialize = api_client.sanitize_for_serialization
        self._watch_timeout_s = watch_timeout_s
        self._request_timeout_s = request_timeout_s
        self._retry_s = retry_s
        self._lock = threading.Lock()
        self._objects: dict[str, dict[str, Mapping[str, Any]] | None] = {
            "pods": None,  # None: not listed yet
            DWM_PLURAL: None,
        }
        self._current: dict[str, frozenset[str]] | None = None
        self._skipped: set[tuple[str, str]] = set()
        self._stop = threading.Event()
        self._watches: list[k8s_watch.Watch] = []
        self._threads: list[threading.Thread] = []

    @property
    def current(self) -> Publishers | None:
        """The publishers last reported (None before both kinds were listed)."""
        with self._lock:
            return None if self._current is None else dict(self._current)

    def pod_endpoints(self) -> dict[str, frozenset[str]]:
        """Pod name -> the FPM publishers its DynamoWorkerMetadata name (ready or not)."""
        with self._lock:
            metadatas = list((self._objects[DWM_PLURAL] or {}).values())
        out: dict[str, frozenset[str]] = {}
        for metadata in metadatas:
            pod = _owner_pod(metadata)
            if pod is not None:
                out[pod] = out.get(pod, frozenset()) | frozenset(fpm_channels(metadata)[0])
        return out

    def start(self) -> None:
        for kind in self._objects:
            thread = threading.Thread(
                target=self._follow, args=(kind,), name=f"fpm-discovery-{kind}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop following; a thread blocked in a quiet watch ends at its next event or
        timeout (it is a daemon thread and reports nothing after this)."""
        self._stop.set()
        for watch in list(self._watches):
            watch.stop()
        for thread in self._threads:
            thread.join(timeout_s)

    # --- per kind -----------------------------------------------------------------------------

    def _list_call(self, kind: str) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
        if kind == "pods":
            selector = f"{DGD_POD_LABEL}={self.dgd_name}"
            return self._core.list_namespaced_pod, (self.namespace,), {"label_selector": selector}
        args = (DWM_GROUP, DWM_VERSION, self.namespace, DWM_PLURAL)
        return self._custom.list_namespaced_custom_object, args, {}

    def _follow(self, kind: str) -> None:
        fn, args, kwargs = self._list_call(kind)
        while not self._stop.is_set():
            try:
                listed = fn(*args, _request_timeout=self._request_timeout_s, **kwargs)
                listed = listed if isinstance(listed, Mapping) else self._serialize(listed)
                items = {self._key(o): o for o in listed.get("items") or []}
                self._replace(kind, items)
                version = (listed.get("metadata") or {}).get("resourceVersion")
                watch = k8s_watch.Watch()
                self._watches.append(watch)
                try:
                    for event in watch.stream(
                        fn,
                        *args,
                        resource_version=version,
                        timeout_seconds=self._watch_timeout_s,
                        _request_timeout=self._request_timeout_s,
                        **kwargs,
                    ):
                        if self._stop.is_set():
                            return
                        self._apply(kind, event)
                finally:
                    self._watches.remove(watch)
            except ApiException as exc:
                if exc.status != 410:  # 410 Gone: the list is too old; list again at once
                    log.warning("FPM discovery: %s of %s: %s", kind, self.namespace, exc.reason)
                    self._stop.wait(self._retry_s)
            except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                log.debug("FPM discovery: %s watch ended (%s); listing again", kind, exc)
                self._stop.wait(self._retry_s)

    def _key(self, obj: Mapping[str, Any]) -> str:
        return str((obj.get("metadata") or {}).get("name"))

    def _apply(self, kind: str, event: Mapping[str, Any]) -> None:
        obj = event.get("object")
        obj = obj if isinstance(obj, Mapping) else self._serialize(obj)
        if not isinstance(obj, Mapping) or event.get("type") == "BOOKMARK":
            return
        if event.get("type") == "ERROR":
            raise ApiException(status=obj.get("code"), reason=obj.get("message"))
        with self._lock:
            objects = dict(self._objects[kind] or {})
        if event.get("type") == "DELETED":
            objects.pop(self._key(obj), None)
        else:
            objects[self._key(obj)] = obj
        self._replace(kind, objects)

    def _replace(self, kind: str, objects: dict[str, Mapping[str, Any]]) -> None:
        with self._lock:
            self._objects[kind] = objects
            pods, metadatas = self._objects["pods"], self._objects[DWM_PLURAL]
            if pods is None or metadatas is None:
                return
            found = publishers(pods.values(), metadatas.values(), self.service_roles)
            self._note_skipped(metadatas.values())
            if found == self._current:
                return
            self._current = found
        log.info(
            "FPM publishers of %s/%s: %s",
            self.namespace,
            self.dgd_name,
            ", ".join(f"{role} {sorted(eps)}" for role, eps in sorted(found.items())) or "none",
        )
        self._on_change(found)

    def _note_skipped(self, metadatas: Iterable[Mapping[str, Any]]) -> None:
        for metadata in metadatas:
            for kind in fpm_channels(metadata)[1]:
                key = (self._key(metadata), kind)
                if key not in self._skipped:
                    self._skipped.add(key)
                    log.warning(
                        "FPM discovery: worker %s publishes forward-pass-metrics over %s, not "
                        "ZMQ; set DYN_EVENT_PLANE=zmq on the workers for the load loop to read it",
                        key[0],
                        kind,
                    )


class DiscoveredEngines:
    """One :class:`EventPlaneFpmSubscriber` per role (``sources``), fed by discovery.

    A role with a static endpoint list in ``config`` keeps that list (the override); the
    others follow an :class:`FpmPublisherWatcher` of the DGD. ``service_roles`` maps each DGD
    service to its role (the Kubernetes connector's ``pod_discovery().service_roles``).
    """

    def __init__(
        self,
        config: PlannerConfig,
        *,
        api_client: k8s_client.ApiClient,
        namespace: str,
        dgd_name: str,
        service_roles: Mapping[str, str],
        clock: Callable[[], float] = time.monotonic,
        name: str = "fpm",
        watcher_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.sources: dict[str, EventPlaneFpmSubscriber] = {}
        discovered: dict[str, str] = {}
        for service, role in service_roles.items():
            static = (
                config.prefill_fpm_endpoints if role == "prefill" else config.decode_fpm_endpoints
            )
            self.sources[role] = EventPlaneFpmSubscriber(
                endpoints=static,
                staleness_s=config.fpm_staleness_seconds,
                clock=clock,
                name=f"{name}-{role}",
            )
            if not static:
                discovered[service] = role
        self.watcher = (
            FpmPublisherWatcher(
                api_client,
                namespace=namespace,
                dgd_name=dgd_name,
                service_roles=discovered,
                on_change=self._follow,
                **dict(watcher_options or {}),
            )
            if discovered
            else None
        )

    def _follow(self, found: Publishers) -> None:
        for role, endpoints in found.items():
            self.sources[role].set_endpoints(endpoints)

    def in_flight_by_pod(self) -> dict[str, int]:
        """Pod name -> requests scheduled and queued on its engines, by their latest fresh
        reports (the Kubernetes connector's ``WorkerLoads``); a discovered pod none of whose
        engines reported is left out (unknown load)."""
        if self.watcher is None:
            return {}
        by_endpoint: dict[str, list[ForwardPassMetrics]] = {}
        for source in self.sources.values():
            by_endpoint.update(source.by_endpoint())
        out: dict[str, int] = {}
        for pod, endpoints in self.watcher.pod_endpoints().items():
            reports = [fpm for endpoint in endpoints for fpm in by_endpoint.get(endpoint, ())]
            if reports:
                out[pod] = sum(requests_in_flight(fpm) for fpm in reports)
        return out

    def start(self) -> None:
        for source in self.sources.values():
            source.start()
        if self.watcher is not None:
            self.watcher.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.watcher is not None:
            self.watcher.stop()
        for source in self.sources.values():
            source.stop(timeout_s)
