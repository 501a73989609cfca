"""``profile.yaml``: our optional manifest describing where a profile came from.

Dynamo's layout carries no metadata, so a profile made by Dynamo's profiler works without a
manifest. When present it records the model, GPU, serving backend and its version, the engine
shape the profile was measured (or modelled) on, and provenance (tool, date, measured or
modelled). Per-role sections ``prefill:`` and ``decode:`` override the engine-shape keys for
that role, because Dynamo's profiler often selects a different parallelism for each.

Unknown top-level keys are kept in :attr:`ProfileManifest.extra` rather than rejected, so a
newer tool can add provenance fields without breaking older readers.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, cast

import yaml

from disagg_planner.profiles.errors import ProfileError

__all__ = ["MANIFEST_FILE", "EngineShape", "ProfileManifest", "dump_manifest", "load_manifest"]

MANIFEST_FILE = "profile.yaml"

SOURCES = ("measured", "modelled")


@dataclass(frozen=True)
class EngineShape:
    """How one engine (a prefill or a decode worker) was configured while profiled.

    ``tp``/``dp``/``ep`` are tensor, data and expert parallel sizes; ``gpus_per_engine`` is the
    GPUs one engine occupies (``tp * dp`` when not given; expert parallelism reuses those GPUs).
    ``max_num_batched_tokens`` and ``max_num_seqs`` are the engine's scheduler limits.
    """

    tp: int = 1
    dp: int = 1
    ep: int = 1
    gpus_per_engine: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None

    @property
    def gpus(self) -> int:
        """GPUs one engine of this shape occupies."""
        return self.gpus_per_engine if self.gpus_per_engine is not None else self.tp * self.dp


_SHAPE_KEYS = tuple(f.name for f in fields(EngineShape))


@dataclass(frozen=True)
class ProfileManifest:
    """Contents of ``profile.yaml``. ``model``, ``gpu``, ``backend`` and ``source`` are required.

    ``source`` is ``measured`` (swept on real hardware) or ``modelled`` (swept on the
    simulator); ``tool`` is the command that made the profile; ``date`` is ISO 8601.
    ``engine`` holds the top-level shape keys; ``prefill_engine``/``decode_engine`` are that
    shape with the per-role overrides applied.
    """

    model: str
    gpu: str
    backend: str
    source: Literal["measured", "modelled"]
    backend_version: str | None = None
    kv_block_size: int | None = None
    tool: str | None = None
    date: str | None = None
    engine: EngineShape = field(default_factory=EngineShape)
    prefill_engine: EngineShape = field(default_factory=EngineShape)
    decode_engine: EngineShape = field(default_factory=EngineShape)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The manifest as ``profile.yaml`` stores it (overrides only where they differ)."""
        out: dict[str, Any] = {"model": self.model, "gpu": self.gpu, "backend": self.backend}
        for key in ("backend_version", "source", "tool", "date", "kv_block_size"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        out.update(_shape_dict(self.engine, EngineShape()))
        for role, shape in (("prefill", self.prefill_engine), ("decode", self.decode_engine)):
            overrides = _shape_dict(shape, self.engine)
            if overrides:
                out[role] = overrides
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out

    def summary(self) -> str:
        """One line for listings: model, GPU, backend, parallelism and provenance."""
        backend = self.backend + (f" {self.backend_version}" if self.backend_version else "")
        shapes = {_shape_text(self.prefill_engine), _shape_text(self.decode_engine)}
        shape = (
            _shape_text(self.prefill_engine)
            if len(shapes) == 1
            else f"prefill {_shape_text(self.prefill_engine)}, "
            f"decode {_shape_text(self.decode_engine)}"
        )
        when = f", {self.date}" if self.date else ""
        return f"{self.model} on {self.gpu}, {backend}, {shape}, {self.source}{when}"


def _shape_text(shape: EngineShape) -> str:
    text = f"tp{shape.tp}"
    if shape.dp != 1:
        text += f" dp{shape.dp}"
    if shape.ep != 1:
        text += f" ep{shape.ep}"
    return text


def _shape_dict(shape: EngineShape, base: EngineShape) -> dict[str, int]:
    return {
        key: getattr(shape, key)
        for key in _SHAPE_KEYS
        if getattr(shape, key) is not None and getattr(shape, key) != getattr(base, key)
    }


def load_manifest(path: str | Path) -> ProfileManifest:
    """Read and validate a ``profile.yaml``; :class:`ProfileError` names the file and key."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileError(f"cannot read the manifest ({exc.strerror})", file=path) from exc
    except yaml.YAMLError as exc:
        raise ProfileError(f"not valid YAML ({exc})", file=path) from exc
    return manifest_from_dict(raw, file=path)


def manifest_from_dict(raw: object, *, file: str | Path | None = None) -> ProfileManifest:
    """Validate a mapping shaped like ``profile.yaml`` (see :class:`ProfileManifest`)."""
    if not isinstance(raw, Mapping):
        raise ProfileError(
            f"the manifest must be a mapping of keys to values, got {type(raw).__name__}",
            file=file,
        )
    data = dict(raw)

    def text(key: str, *, required: bool) -> str | None:
        if key not in data or data[key] is None:
            if required:
                raise ProfileError("required key is missing", file=file, key=key)
            return None
        value = data.pop(key)
        if isinstance(value, _dt.date):  # YAML reads 2025-01-31 as a date
            return value.isoformat()
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ProfileError("must be a string", file=file, key=key, value=value, has_value=True)
        if isinstance(value, str) and not value.strip():
            raise ProfileError("must not be empty", file=file, key=key)
        return str(value)

    model = cast(str, text("model", required=True))
    gpu = cast(str, text("gpu", required=True))
    backend = cast(str, text("backend", required=True))
    source = cast(str, text("source", required=True))
    if source not in SOURCES:
        raise ProfileError(
            f"must be one of {', '.join(SOURCES)}",
            file=file,
            key="source",
            value=source,
            has_value=True,
        )
    backend_version = text("backend_version", required=False)
    tool = text("tool", required=False)
    date = text("date", required=False)
    kv_block_size = _positive_int(data, "kv_block_size", file=file, prefix="")
    engine = _shape(data, file=file, prefix="", base=EngineShape())
    overrides = {}
    for role in ("prefill", "decode"):
        section = data.pop(role, None)
        if section is None:
            overrides[role] = engine
            continue
        if not isinstance(section, Mapping):
            raise ProfileError(
                "must be a mapping of engine-shape keys (" + ", ".join(_SHAPE_KEYS) + ")",
                file=file,
                key=role,
                value=section,
                has_value=True,
            )
        section = dict(section)
        overrides[role] = _shape(section, file=file, prefix=f"{role}.", base=engine)
        if section:
            unknown = ", ".join(sorted(map(str, section)))
            raise ProfileError(
                f"unknown key(s) {unknown}; expected some of {', '.join(_SHAPE_KEYS)}",
                file=file,
                key=role,
            )
    return ProfileManifest(
        model=model,
        gpu=gpu,
        backend=backend,
        source=cast(Literal["measured", "modelled"], source),
        backend_version=backend_version,
        kv_block_size=kv_block_size,
        tool=tool,
        date=date,
        engine=engine,
        prefill_engine=overrides["prefill"],
        decode_engine=overrides["decode"],
        extra={str(k): v for k, v in data.items()},
    )


def _positive_int(
    data: dict[Any, Any], key: str, *, file: str | Path | None, prefix: str
) -> int | None:
    if key not in data or data[key] is None:
        data.pop(key, None)
        return None
    value = data.pop(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ProfileError(
            "must be a positive integer", file=file, key=prefix + key, value=value, has_value=True
        )
    return value


def _shape(
    data: dict[Any, Any], *, file: str | Path | None, prefix: str, base: EngineShape
) -> EngineShape:
    changes = {}
    for key in _SHAPE_KEYS:
        value = _positive_int(data, key, file=file, prefix=prefix)
        if value is not None:
            changes[key] = value
    return replace(base, **changes)


def dump_manifest(manifest: ProfileManifest, path: str | Path) -> None:
    """Write ``manifest`` as YAML to ``path`` (the inverse of :func:`load_manifest`)."""
    Path(path).write_text(
        yaml.safe_dump(manifest.to_dict(), sort_keys=False, allow_unicode=True), encoding="utf-8"
    )
