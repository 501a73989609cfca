"""Watch caches of the DGDs and their scaling adapters: one list and one watch per namespace
and resource for the whole process, however many deployments it plans.

A connector given a :class:`WatchCaches` reads the DGD and its adapters from them (no GET per
tick), and a GET only when the cache is not synced yet or is older than the connector's own
last write (the write's ``resourceVersion`` is not in the cache yet: reading the object from
before it would look like someone else's edit). Writes go to the API server as before, and
only when something changes. A followed object that appears (a DGD deleted and applied
again) calls the callbacks subscribed to its name: the loop of that deployment wakes up
instead of waiting out its error backoff.

Each cache runs one daemon thread: list, then watch from that list's version; when the watch
ends (the server's timeout, a dropped connection, a 410 Gone) it lists again.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from disagg_planner.connectors.kubernetes.api import DGD_GROUP, DGD_VERSION

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 240
RETRY_S = 2.0


def version_number(obj: Mapping[str, Any] | None) -> int | None:
    """An object's ``metadata.resourceVersion`` as a number (etcd's revision, as every
    Kubernetes API server and kmock write it), None when absent or not a number."""
    raw = ((obj or {}).get("metadata") or {}).get("resourceVersion")
    if not isinstance(raw, str | int):
        return None
    try:
        return int(raw)
    except ValueError:
        return None


class WatchedResource:
    """The objects of one custom resource in one namespace, followed by a watch."""

    def __init__(
        self,
        api_client: k8s_client.ApiClient,
        *,
        namespace: str,
        plural: str,
        version: str = DGD_VERSION,
        request_timeout_s: float = 60.0,
    ) -> None:
        self.namespace = namespace
        self.plural = plural
        self.version = version
        self._custom = k8s_client.CustomObjectsApi(api_client)
        self._serialize = api_client.sanitize_for_serialization
        self._request_timeout_s = request_timeout_s
        self._lock = threading.Lock()
        self._objects: dict[str, Mapping[str, Any]] = {}
        self._synced = False
        self._subscribers: dict[str, list[Callable[[], None]]] = {}
        self._stop = threading.Event()
        self._watch: k8s_watch.Watch | None = None
        self._response: Any = None  # the open watch's (urllib3), to end it from stop()
        self._thread = threading.Thread(
            target=self._follow, name=f"watch-{plural}-{namespace}", daemon=True
        )
        self.users = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stop.set()
            response = self._response
        if self._watch is not None:
            self._watch.stop()
        if response is not None:
            _unblock(response)

    @property
    def synced(self) -> bool:
        with self._lock:
            return self._synced

    def get(self, name: str) -> tuple[bool, Mapping[str, Any] | None]:
        """(synced, the object or None when there is none); unsynced: (False, None)."""
        with self._lock:
            return self._synced, self._objects.get(name) if self._synced else None

    def subscribe(self, name: str, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (from the watch thread) whenever ``name`` appears or changes;
        returns the unsubscribe."""
        with self._lock:
            self._subscribers.setdefault(name, []).append(callback)

        def unsubscribe() -> None:
            with self._lock:
                callbacks = self._subscribers.get(name, [])
                if callback in callbacks:
                    callbacks.remove(callback)

        return unsubscribe

    def _follow(self) -> None:
        args = (DGD_GROUP, self.version, self.namespace, self.plural)
        fn = self._custom.list_namespaced_custom_object

        @functools.wraps(fn)
        def watching(*a: Any, **kw: Any) -> Any:
            # A watch opened as (or after) stop() ran would wait for an event or its timeout
            # (minutes) before this thread saw the stop: whichever of the two comes second
            # ends it (Watch.stop() alone misses a watch whose request is still in flight).
            response = fn(*a, **kw)
            with self._lock:
                self._response = response
                stopped = self._stop.is_set()
            if stopped:
                _unblock(response)
            return response

        while not self._stop.is_set():
            try:
                answer = fn(*args, _request_timeout=self._request_timeout_s)
                listed: Mapping[str, Any] = answer if isinstance(answer, Mapping) else {}
                items = {self._key(o): o for o in listed.get("items") or []}
                changed = self._replace(items)
                self._notify(changed)
                version = (listed.get("metadata") or {}).get("resourceVersion")
                self._watch = k8s_watch.Watch()
                for event in self._watch.stream(
                    watching,
                    *args,
                    resource_version=version,
                    timeout_seconds=WATCH_TIMEOUT_S,
                    _request_timeout=self._request_timeout_s + WATCH_TIMEOUT_S,
                ):
                    if self._stop.is_set():
                        return
                    self._notify(self._apply(event))
            except ApiException as exc:
                if exc.status != 410:  # 410 Gone: the list is too old; list again at once
                    log.warning("watch of %s in %s: %s", self.plural, self.namespace, exc.reason)
                    self._unsync()
                    self._stop.wait(RETRY_S)
            except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                log.debug("watch of %s ended (%s); listing again", self.plural, exc)
                self._unsync()
                self._stop.wait(RETRY_S)

    def _key(self, obj: Mapping[str, Any]) -> str:
        return str((obj.get("metadata") or {}).get("name"))

    def _unsync(self) -> None:
        with self._lock:
            self._synced = False

    def _replace(self, items: dict[str, Mapping[str, Any]]) -> list[str]:
        with self._lock:
            changed = [
                name
                for name, obj in items.items()
                if version_number(self._objects.get(name)) != version_number(obj)
            ]
            self._objects = items
            self._synced = True
        return changed

    def _apply(self, event: Mapping[str, Any]) -> list[str]:
        obj = event.get("object")
        obj = obj if isinstance(obj, Mapping) else self._serialize(obj)
        kind = event.get("type")
        if not isinstance(obj, Mapping) or kind == "BOOKMARK":
            return []
        if kind == "ERROR":
            raise ApiException(status=obj.get("code"), reason=obj.get("message"))
        name = self._key(obj)
        with self._lock:
            if kind == "DELETED":
                self._objects.pop(name, None)
                return []
            self._objects[name] = obj
        return [name]

    def _notify(self, names: list[str]) -> None:
        for name in names:
            with self._lock:
                callbacks = list(self._subscribers.get(name, ()))
            for callback in callbacks:
                try:
                    callback()
                except Exception:  # a subscriber's failure must not end the watch
                    log.exception("watch of %s: a subscriber of %s failed", self.plural, name)


def _unblock(response: Any) -> None:
    """End a blocked read of ``response`` from another thread (its socket shut for reading)."""
    with contextlib.suppress(Exception):  # already closed or released: nothing blocks on it
        response.shutdown()


class WatchCaches:
    """The process's watch caches, one per (namespace, resource, version), started on first
    use and stopped when their last user releases them."""

    def __init__(self, api_client: k8s_client.ApiClient) -> None:
        self._api_client = api_client
        self._lock = threading.Lock()
        self._caches: dict[tuple[str, str, str], WatchedResource] = {}

    def acquire(self, namespace: str, plural: str, version: str = DGD_VERSION) -> WatchedResource:
        with self._lock:
            key = (namespace, plural, version)
            cache = self._caches.get(key)
            if cache is None:
                cache = WatchedResource(
                    self._api_client, namespace=namespace, plural=plural, version=version
                )
                self._caches[key] = cache
                cache.start()
            cache.users += 1
            return cache

    def release(self, cache: WatchedResource) -> None:
        with self._lock:
            cache.users -= 1
            if cache.users <= 0:
                self._caches.pop((cache.namespace, cache.plural, cache.version), None)
                cache.stop()

    def close(self) -> None:
        with self._lock:
            caches, self._caches = list(self._caches.values()), {}
        for cache in caches:
            cache.stop()
