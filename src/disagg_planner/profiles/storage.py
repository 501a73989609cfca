"""Reading, validating and writing profile data in Dynamo's on-disk layout.

Layout of a profile directory ``DIR`` (as written by Dynamo's pre-deployment profiler)::

    DIR/selected_prefill_interpolation/raw_data.npz   prefill_isl            tokens
                                                      prefill_ttft           ms
                                                      prefill_thpt_per_gpu   tokens/s/GPU
    DIR/selected_decode_interpolation/raw_data.npz    x_kv_usage             fraction 0-1
                                                      y_context_length       tokens
                                                      z_itl                  ms
                                                      z_thpt_per_gpu         tokens/s/GPU
                                                      max_kv_tokens          tokens, 1 element
    DIR/profile.yaml                                  optional manifest (ours)

Prefill arrays are 1-D and of equal length, one entry per profiled ISL. Decode arrays are
scattered points, one per (KV usage, context length) measurement. When an NPZ file is absent,
``prefill_raw_data.json`` / ``decode_raw_data.json`` in the same folder are read instead (the
form Dynamo mounts from a ConfigMap): the same keys, lists of numbers, ``max_kv_tokens`` an
integer.
"""

from __future__ import annotations

import json
import numbers
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from disagg_planner.profiles.errors import ProfileError
from disagg_planner.profiles.manifest import MANIFEST_FILE, ProfileManifest, dump_manifest

__all__ = [
    "DECODE_DIR",
    "DECODE_JSON",
    "DECODE_KEYS",
    "NPZ_FILE",
    "PREFILL_DIR",
    "PREFILL_JSON",
    "PREFILL_KEYS",
    "DecodeData",
    "PrefillData",
    "decode_data",
    "prefill_data",
    "read_decode",
    "read_prefill",
    "write_profile",
]

PREFILL_DIR = "selected_prefill_interpolation"
DECODE_DIR = "selected_decode_interpolation"
NPZ_FILE = "raw_data.npz"
PREFILL_JSON = "prefill_raw_data.json"
DECODE_JSON = "decode_raw_data.json"
PREFILL_KEYS = ("prefill_isl", "prefill_ttft", "prefill_thpt_per_gpu")
DECODE_KEYS = ("x_kv_usage", "y_context_length", "z_itl", "z_thpt_per_gpu")
MAX_KV_KEY = "max_kv_tokens"

MIN_PREFILL_POINTS = 2
MIN_DECODE_POINTS = 3

_HOW_TO_MAKE = (
    "make one with Dynamo's pre-deployment profiler or `planner profile`, "
    "see disagg_planner/profiles/bundled/README.md"
)

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class PrefillData:
    """Validated prefill samples: ISL strictly increasing, every value finite and positive."""

    isl: FloatArray
    ttft_ms: FloatArray
    thpt_per_gpu: FloatArray
    file: str | None = None


@dataclass(frozen=True, eq=False)
class DecodeData:
    """Validated decode samples (scattered points, no duplicate (KV usage, context) pair)."""

    kv_usage: FloatArray
    context_length: FloatArray
    itl_ms: FloatArray
    thpt_per_gpu: FloatArray
    max_kv_tokens: int
    file: str | None = None


# --- validation ---------------------------------------------------------------------------

_Rule = tuple[Callable[[FloatArray], npt.NDArray[np.bool_]], str]
_POSITIVE: _Rule = (lambda a: a > 0, "must be positive")
_FRACTION: _Rule = (lambda a: (a >= 0) & (a <= 1), "must be a fraction between 0 and 1")


def _vector(raw: object, *, file: str | None, key: str, rule: _Rule) -> FloatArray:
    """``raw`` as a read-only 1-D float64 array, or a ProfileError naming the bad element."""
    if isinstance(raw, list | tuple):
        for i, item in enumerate(raw):
            if isinstance(item, bool) or not isinstance(item, numbers.Real):
                raise ProfileError("must be a number", file=file, key=key, index=i, value=item)
        arr = np.asarray(raw, dtype=np.float64)
        if arr.ndim != 1:  # an empty list of lists is the only way here
            raise ProfileError("must be a flat list of numbers", file=file, key=key)
    else:
        arr = np.asarray(raw)
        if arr.dtype.kind not in "iuf":
            raise ProfileError(
                f"must hold numbers, got an array of dtype {arr.dtype}", file=file, key=key
            )
        if arr.ndim != 1:
            raise ProfileError(f"must be a 1-D array, got shape {arr.shape}", file=file, key=key)
        arr = arr.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        i = int(bad[0])
        raise ProfileError("must be a finite number", file=file, key=key, index=i, value=arr[i])
    check, message = rule
    bad = np.flatnonzero(~check(arr))
    if bad.size:
        i = int(bad[0])
        raise ProfileError(message, file=file, key=key, index=i, value=arr[i])
    arr.setflags(write=False)
    return arr


def _same_length(arrays: Mapping[str, FloatArray], *, file: str | None, minimum: int) -> int:
    (first_key, first), *rest = arrays.items()
    for key, arr in rest:
        if arr.size != first.size:
            raise ProfileError(
                f"has {arr.size} values but {first_key} has {first.size}; "
                "the arrays must have equal length",
                file=file,
                key=key,
            )
    if first.size < minimum:
        raise ProfileError(
            f"has {first.size} point(s); at least {minimum} are needed to interpolate",
            file=file,
            key=first_key,
        )
    return int(first.size)


def prefill_data(
    *,
    isl: object,
    ttft_ms: object,
    thpt_per_gpu: object,
    file: str | Path | None = None,
) -> PrefillData:
    """Validate prefill samples given under Dynamo's key names' meanings.

    Rules: 1-D, equal length, at least 2 points, finite, positive, ISL strictly increasing
    (a duplicate or out-of-order ISL is reported with both indices).
    """
    where = None if file is None else str(file)
    k_isl, k_ttft, k_thpt = PREFILL_KEYS
    arrays = {
        k_isl: _vector(isl, file=where, key=k_isl, rule=_POSITIVE),
        k_ttft: _vector(ttft_ms, file=where, key=k_ttft, rule=_POSITIVE),
        k_thpt: _vector(thpt_per_gpu, file=where, key=k_thpt, rule=_POSITIVE),
    }
    _same_length(arrays, file=where, minimum=MIN_PREFILL_POINTS)
    x = arrays[k_isl]
    steps = np.flatnonzero(np.diff(x) <= 0)
    if steps.size:
        i = int(steps[0]) + 1
        prev = x[i - 1].item()
        rule = (
            f"duplicate ISL point (equal to {k_isl}[{i - 1}])"
            if x[i] == x[i - 1]
            else f"ISL points must be strictly increasing ({k_isl}[{i - 1}] = {prev!r})"
        )
        raise ProfileError(rule, file=where, key=k_isl, index=i, value=x[i])
    return PrefillData(isl=x, ttft_ms=arrays[k_ttft], thpt_per_gpu=arrays[k_thpt], file=where)


def decode_data(
    *,
    kv_usage: object,
    context_length: object,
    itl_ms: object,
    thpt_per_gpu: object,
    max_kv_tokens: object,
    file: str | Path | None = None,
) -> DecodeData:
    """Validate decode samples.

    Rules: 1-D, equal length, at least 3 points covering at least 2 KV usages and 2 context
    lengths (a surface needs a 2-D spread), finite, KV usage in [0, 1], the rest positive, no
    duplicate (KV usage, context length) pair, ``max_kv_tokens`` one positive integer.
    """
    where = None if file is None else str(file)
    k_x, k_y, k_itl, k_thpt = DECODE_KEYS
    arrays = {
        k_x: _vector(kv_usage, file=where, key=k_x, rule=_FRACTION),
        k_y: _vector(context_length, file=where, key=k_y, rule=_POSITIVE),
        k_itl: _vector(itl_ms, file=where, key=k_itl, rule=_POSITIVE),
        k_thpt: _vector(thpt_per_gpu, file=where, key=k_thpt, rule=_POSITIVE),
    }
    _same_length(arrays, file=where, minimum=MIN_DECODE_POINTS)
    x, y = arrays[k_x], arrays[k_y]
    order = np.lexsort((x, y))
    same = np.flatnonzero((np.diff(x[order]) == 0) & (np.diff(y[order]) == 0))
    if same.size:
        a, b = sorted((int(order[same[0]]), int(order[same[0] + 1])))
        raise ProfileError(
            f"duplicate decode point: ({k_x}, {k_y}) at index {b} repeats index {a}",
            file=where,
            key=k_y,
            index=b,
            value=y[b],
        )
    for key, arr in ((k_y, y), (k_x, x)):
        distinct = np.unique(arr)
        if distinct.size < 2:
            raise ProfileError(
                f"all points share the value {distinct[0].item()!r}; a decode surface needs "
                "at least 2 distinct KV usages and 2 distinct context lengths",
                file=where,
                key=key,
            )
    return DecodeData(
        kv_usage=x,
        context_length=y,
        itl_ms=arrays[k_itl],
        thpt_per_gpu=arrays[k_thpt],
        max_kv_tokens=_max_kv_tokens(max_kv_tokens, file=where),
        file=where,
    )


def _max_kv_tokens(raw: object, *, file: str | None) -> int:
    if isinstance(raw, list | tuple | np.ndarray):
        arr = np.asarray(raw)
        if arr.size != 1:
            raise ProfileError(
                f"must hold exactly one value, got shape {arr.shape}", file=file, key=MAX_KV_KEY
            )
        raw = arr.reshape(()).item()
    if (
        isinstance(raw, bool)
        or not isinstance(raw, int | float)
        or not np.isfinite(raw)
        or raw < 1
        or raw != int(raw)
    ):
        raise ProfileError(
            "must be a positive integer (tokens of KV cache per engine)",
            file=file,
            key=MAX_KV_KEY,
            index=0,
            value=raw,
        )
    return int(raw)


# --- reading -------------------------------------------------------------------------------


def _locate(folder: Path, json_name: str) -> Path:
    npz, js = folder / NPZ_FILE, folder / json_name
    if npz.is_file():
        return npz
    if js.is_file():
        return js
    raise ProfileError(f"neither {npz} nor {js} exists; {_HOW_TO_MAKE}")


_ZIP_MAGIC = b"PK\x03\x04"


def _check_npz_magic(path: Path) -> None:
    """An NPZ file is a zip archive of ``.npy`` arrays. Anything else would reach numpy's
    fallback, which reads it as a pickle and advises loading it unsafely: say what it is."""
    try:
        with path.open("rb") as f:
            head = f.read(len(_ZIP_MAGIC))
    except OSError as exc:
        raise ProfileError(f"cannot read the file ({exc.strerror})", file=path) from exc
    if head != _ZIP_MAGIC:
        raise ProfileError(
            f"not an NPZ file: expected a zip archive of .npy arrays (starting {_ZIP_MAGIC!r}), "
            f"got {head!r} ({path.stat().st_size} bytes); {_HOW_TO_MAKE}",
            file=path,
        )


def _load_mapping(path: Path, keys: tuple[str, ...]) -> dict[str, Any]:
    """The arrays stored under ``keys`` in an NPZ or JSON file, naming a missing key."""
    data: dict[str, Any] = {}
    if path.suffix == ".npz":
        _check_npz_magic(path)
        try:
            with np.load(path, allow_pickle=False) as npz:
                present = list(npz.files)
                for key in keys:
                    if key in present:
                        try:
                            data[key] = npz[key]
                        except ValueError as exc:  # object arrays need pickle: refuse
                            raise ProfileError(
                                f"cannot be read without pickle ({exc})", file=path, key=key
                            ) from exc
        except ProfileError:
            raise
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise ProfileError(f"not a readable NPZ file ({exc})", file=path) from exc
    else:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ProfileError(f"cannot read the file ({exc.strerror})", file=path) from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ProfileError(f"not valid JSON ({exc})", file=path) from exc
        if not isinstance(raw, dict):
            raise ProfileError(
                f"must be a JSON object of arrays, got {type(raw).__name__}", file=path
            )
        present = list(raw)
        data = {key: raw[key] for key in keys if key in raw}
    for key in keys:
        if key not in data:
            have = ", ".join(present) if present else "no keys"
            raise ProfileError(f"missing key (the file has {have})", file=path, key=key)
    return data


def read_prefill(profile_dir: str | Path) -> PrefillData:
    """Read ``selected_prefill_interpolation/raw_data.npz`` (or its JSON fallback)."""
    path = _locate(Path(profile_dir) / PREFILL_DIR, PREFILL_JSON)
    raw = _load_mapping(path, PREFILL_KEYS)
    return prefill_data(
        isl=raw["prefill_isl"],
        ttft_ms=raw["prefill_ttft"],
        thpt_per_gpu=raw["prefill_thpt_per_gpu"],
        file=path,
    )


def read_decode(profile_dir: str | Path) -> DecodeData:
    """Read ``selected_decode_interpolation/raw_data.npz`` (or its JSON fallback)."""
    path = _locate(Path(profile_dir) / DECODE_DIR, DECODE_JSON)
    raw = _load_mapping(path, (*DECODE_KEYS, MAX_KV_KEY))
    return decode_data(
        kv_usage=raw["x_kv_usage"],
        context_length=raw["y_context_length"],
        itl_ms=raw["z_itl"],
        thpt_per_gpu=raw["z_thpt_per_gpu"],
        max_kv_tokens=raw[MAX_KV_KEY],
        file=path,
    )


# --- writing -------------------------------------------------------------------------------


def write_profile(
    directory: str | Path,
    *,
    prefill_isl: npt.ArrayLike,
    prefill_ttft_ms: npt.ArrayLike,
    prefill_thpt_per_gpu: npt.ArrayLike,
    decode_kv_usage: npt.ArrayLike,
    decode_context_length: npt.ArrayLike,
    decode_itl_ms: npt.ArrayLike,
    decode_thpt_per_gpu: npt.ArrayLike,
    max_kv_tokens: int,
    manifest: ProfileManifest | None = None,
    file_format: Literal["npz", "json"] = "npz",
) -> Path:
    """Write a profile in exactly Dynamo's layout and return its directory.

    The data are validated first (the same rules as reading), so a sweep cannot leave a
    profile that the planner would refuse. ``file_format="json"`` writes the ConfigMap-style
    JSON fallback files instead of NPZ. A manifest, when given, goes to ``profile.yaml``.
    Units: ISL and context in tokens, TTFT and ITL in ms, throughput in tokens/s/GPU, KV usage
    as a 0-1 fraction of ``max_kv_tokens``.
    """
    root = Path(directory)
    names = {"npz": (NPZ_FILE, NPZ_FILE), "json": (PREFILL_JSON, DECODE_JSON)}
    if file_format not in names:
        raise ValueError(f"file_format must be 'npz' or 'json', got {file_format!r}")
    prefill_file = root / PREFILL_DIR / names[file_format][0]
    decode_file = root / DECODE_DIR / names[file_format][1]
    pre = prefill_data(
        isl=_as_input(prefill_isl),
        ttft_ms=_as_input(prefill_ttft_ms),
        thpt_per_gpu=_as_input(prefill_thpt_per_gpu),
        file=prefill_file,
    )
    dec = decode_data(
        kv_usage=_as_input(decode_kv_usage),
        context_length=_as_input(decode_context_length),
        itl_ms=_as_input(decode_itl_ms),
        thpt_per_gpu=_as_input(decode_thpt_per_gpu),
        max_kv_tokens=max_kv_tokens,
        file=decode_file,
    )
    prefill_arrays = dict(zip(PREFILL_KEYS, (pre.isl, pre.ttft_ms, pre.thpt_per_gpu), strict=True))
    decode_arrays = dict(
        zip(
            DECODE_KEYS,
            (dec.kv_usage, dec.context_length, dec.itl_ms, dec.thpt_per_gpu),
            strict=True,
        )
    )
    (root / PREFILL_DIR).mkdir(parents=True, exist_ok=True)
    (root / DECODE_DIR).mkdir(parents=True, exist_ok=True)
    if file_format == "npz":
        np.savez(prefill_file, **prefill_arrays)  # type: ignore[arg-type]
        np.savez(
            decode_file,
            **decode_arrays,  # type: ignore[arg-type]
            max_kv_tokens=np.array([dec.max_kv_tokens]),
        )
    else:
        _dump_json(prefill_file, prefill_arrays)
        _dump_json(decode_file, {**decode_arrays, MAX_KV_KEY: dec.max_kv_tokens})
    if manifest is not None:
        dump_manifest(manifest, root / MANIFEST_FILE)
    return root


def _as_input(values: npt.ArrayLike) -> object:
    return values if isinstance(values, list | tuple) else np.asarray(values)


def _dump_json(path: Path, arrays: Mapping[str, Any]) -> None:
    payload = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in arrays.items()}
    path.write_text(json.dumps(payload), encoding="utf-8")
