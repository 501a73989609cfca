"""A loaded performance profile: both interpolators, the KV capacity and the manifest."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from disagg_planner.profiles.decode import DEFAULT_RESOLUTION, DecodeInterpolator
from disagg_planner.profiles.errors import ProfileError
from disagg_planner.profiles.manifest import MANIFEST_FILE, ProfileManifest, load_manifest
from disagg_planner.profiles.prefill import PrefillInterpolator
from disagg_planner.profiles.storage import read_decode, read_prefill

__all__ = ["Profile", "load_profile"]


@dataclass(frozen=True, eq=False)
class Profile:
    """Everything the planner needs from one profile directory.

    ``max_kv_tokens`` is the KV-cache capacity of one decode engine in tokens; ``manifest`` is
    ``None`` for a profile without ``profile.yaml`` (e.g. one made by Dynamo's profiler).
    """

    prefill: PrefillInterpolator
    decode: DecodeInterpolator
    max_kv_tokens: int
    manifest: ProfileManifest | None
    source_dir: Path


def load_profile(path: str | Path, *, decode_resolution: int = DEFAULT_RESOLUTION) -> Profile:
    """Read and validate the profile in directory ``path`` (Dynamo's layout, see
    :mod:`disagg_planner.profiles.storage`), building both interpolators once.

    Raises :class:`~disagg_planner.profiles.errors.ProfileError` naming the file, key, index and
    value of the first problem found.
    """
    root = Path(path)
    if not root.exists():
        raise ProfileError(f"profile directory {root} does not exist")
    if not root.is_dir():
        raise ProfileError(f"{root} is not a directory; a profile is a directory")
    prefill = PrefillInterpolator(read_prefill(root))
    manifest_path = root / MANIFEST_FILE
    manifest = load_manifest(manifest_path) if manifest_path.exists() else None
    # the engine's seats (max_num_seqs on each DP rank) bound the batches the lookup answers
    seats = None
    shape = manifest.decode_engine if manifest is not None else None
    if shape is not None and shape.max_num_seqs is not None:
        seats = float(shape.max_num_seqs * shape.dp)
    decode = DecodeInterpolator(read_decode(root), resolution=decode_resolution, max_running=seats)
    return Profile(
        prefill=prefill,
        decode=decode,
        max_kv_tokens=decode.max_kv_tokens,
        manifest=manifest,
        source_dir=root,
    )
