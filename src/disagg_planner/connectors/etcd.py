"""A minimal etcd v3 client over etcd's JSON gateway (``/v3/kv/*``, ``/v3/watch``).

etcd serves the gateway on its client URL (3.4 and later; no extra process). Keys and values
travel base64-encoded and int64 fields as JSON strings. This client covers what the virtual
connector needs: range reads of a prefix, compare-and-swap transactions and a watch with a
deadline. It is synchronous (the standard library's urllib); async callers run it in a
thread. Authentication and TLS client certificates are not supported.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from disagg_planner.errors import ConnectorError


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` that selects every key starting with ``prefix``."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\x00"  # every key


@dataclass(frozen=True)
class KeyValue:
    """One stored key: its value and the revision of its last change."""

    key: str
    value: bytes
    mod_revision: int


@dataclass(frozen=True)
class Put:
    """A put inside a transaction."""

    key: str
    value: bytes


@dataclass(frozen=True)
class ModRevisionIs:
    """Compare: the key's last change is at ``revision`` (0: the key does not exist)."""

    key: str
    revision: int


class EtcdGateway:
    """Requests to one etcd endpoint; every failure is a ConnectorError naming the endpoint."""

    def __init__(self, endpoint: str, *, timeout_s: float) -> None:
        if not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"etcd endpoint must be an http:// or https:// URL, got {endpoint!r}")
        self.endpoint = endpoint.rstrip("/")
        self.timeout_s = timeout_s

    def _request(self, path: str, body: Mapping[str, Any], timeout_s: float) -> Any:
        request = urllib.request.Request(
            self.endpoint + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        return urllib.request.urlopen(request, timeout=timeout_s)

    def _post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        try:
            with self._request(path, body, self.timeout_s) as response:
                answer = json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace").strip()[:300]
            raise ConnectorError(
                f"etcd at {self.endpoint}{path} answered {exc.code}: {detail or exc.reason}"
            ) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ConnectorError(f"etcd at {self.endpoint} is unreachable: {exc}") from exc
        except ValueError as exc:
            raise ConnectorError(f"etcd at {self.endpoint}{path}: answer is not JSON") from exc
        if not isinstance(answer, dict):
            raise ConnectorError(f"etcd at {self.endpoint}{path}: answer is not an object")
        return answer

    def range_prefix(self, prefix: str) -> tuple[int, dict[str, KeyValue]]:
        """Every key under ``prefix`` and the store revision of the read."""
        raw = prefix.encode()
        answer = self._post("/v3/kv/range", {"key": _b64(raw), "range_end": _b64(prefix_end(raw))})
        revision = int(answer.get("header", {}).get("revision", 0))
        found: dict[str, KeyValue] = {}
        for kv in answer.get("kvs", []):
            key = _unb64(kv["key"]).decode()
            found[key] = KeyValue(key, _unb64(kv.get("value", "")), int(kv.get("mod_revision", 0)))
        return revision, found

    def txn(self, compare: Sequence[ModRevisionIs], success: Sequence[Put]) -> bool:
        """Apply ``success`` atomically if every compare holds; whether it was applied."""
        body = {
            "compare": [
                {
                    "target": "MOD",
                    "key": _b64(c.key.encode()),
                    "mod_revision": str(c.revision),
                    "result": "EQUAL",
                }
                for c in compare
            ],
            "success": [
                {"request_put": {"key": _b64(p.key.encode()), "value": _b64(p.value)}}
                for p in success
            ],
        }
        return bool(self._post("/v3/kv/txn", body).get("succeeded", False))

    def watch(self, prefix: str, start_revision: int, timeout_s: float) -> bool:
        """Block until a key under ``prefix`` changes at or after ``start_revision``.

        True when a change (or a compaction past ``start_revision``) was seen, False when
        ``timeout_s`` passed without one.
        """
        raw = prefix.encode()
        body = {
            "create_request": {
                "key": _b64(raw),
                "range_end": _b64(prefix_end(raw)),
                "start_revision": str(start_revision),
            }
        }
        try:
            with self._request("/v3/watch", body, timeout_s) as response:
                for line in response:
                    if not line.strip():
                        continue
                    result = json.loads(line).get("result", {})
                    if result.get("events") or result.get("compact_revision"):
                        return True
                    if result.get("canceled"):
                        return True  # the caller re-reads and decides
        except TimeoutError:
            return False
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                return False
            raise ConnectorError(f"etcd at {self.endpoint} is unreachable: {exc}") from exc
        except OSError as exc:
            raise ConnectorError(f"etcd watch at {self.endpoint} failed: {exc}") from exc
        except ValueError as exc:
            raise ConnectorError(f"etcd watch at {self.endpoint}: answer is not JSON") from exc
        return False
