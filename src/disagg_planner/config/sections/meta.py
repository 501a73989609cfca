"""What every section's fields share: the metadata flags, environment variables and
``--help`` read from a field, and the check of an HTTP URL."""

from __future__ import annotations

from typing import Any


def field_meta(
    group: str, *, flags: tuple[str, ...] = (), env: tuple[str, ...] = ()
) -> dict[str, Any]:
    """A field's ``json_schema_extra``: ``group``, the ``--help`` heading it is listed under
    (config/flags.py); ``flags``, more command-line spellings (Dynamo's legacy argparse
    flags); ``env``, more environment variables (Dynamo's own names, e.g.
    ``PROMETHEUS_ENDPOINT``)."""
    return {"group": group, "flags": list(flags), "env": list(env)}


def http_url(value: str) -> str:
    """``value`` without a trailing slash; ValueError unless it is an http(s) URL."""
    if not value.startswith(("http://", "https://")):
        raise ValueError("must be an http:// or https:// URL")
    return value.rstrip("/")
