"""Where profiles live: a directory given by the user, or a bundled one by name.

Bundled profiles are package data of this library (``bundled/``, installed with the wheel), one
directory per ``<gpu>/<backend>/<model>/<parallelism>`` (e.g.
``h200_sxm/vllm/llama-3.1-8b-fp8/tp1``);
a directory is a profile when it contains ``selected_prefill_interpolation/``. The environment
variable ``PLANNER_PROFILES_DIR`` points the registry somewhere else (a container image may mount
a larger profile library anywhere).
"""

from __future__ import annotations

import os
from pathlib import Path

from disagg_planner.profiles.errors import ProfileError
from disagg_planner.profiles.manifest import MANIFEST_FILE, ProfileManifest, load_manifest
from disagg_planner.profiles.storage import PREFILL_DIR

__all__ = [
    "PROFILES_DIR_ENV",
    "bundled_profiles_root",
    "list_bundled",
    "resolve_configured_profile",
    "resolve_profile",
]

PROFILES_DIR_ENV = "PLANNER_PROFILES_DIR"


def bundled_profiles_root() -> Path:
    """The folder of bundled profiles: ``$PLANNER_PROFILES_DIR``, else this package's
    ``bundled/`` data folder (in a checkout and in an installed wheel alike). It may not exist."""
    override = os.environ.get(PROFILES_DIR_ENV)
    if override:
        return Path(override)
    return Path(__file__).resolve().parent / "bundled"


def _is_profile(path: Path) -> bool:
    return (path / PREFILL_DIR).is_dir()


def _bundled_names(root: Path) -> list[str]:
    if not root.is_dir():
        return []
    names = []
    for current, dirs, _files in os.walk(root):
        here = Path(current)
        if _is_profile(here) and here != root:
            names.append(here.relative_to(root).as_posix())
            dirs.clear()  # a profile's own folders hold data, not more profiles
        else:
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    return sorted(names)


def list_bundled() -> list[tuple[str, ProfileManifest | None]]:
    """Every bundled profile's name with its manifest (``None`` when it has none), sorted."""
    root = bundled_profiles_root()
    out: list[tuple[str, ProfileManifest | None]] = []
    for name in _bundled_names(root):
        manifest_path = root / name / MANIFEST_FILE
        out.append((name, load_manifest(manifest_path) if manifest_path.exists() else None))
    return out


def resolve_profile(name_or_dir: str) -> Path:
    """The directory of a profile given as a path or as a bundled profile's name.

    An existing directory wins; otherwise the name is looked up under
    :func:`bundled_profiles_root`. Raises :class:`ProfileError` listing the bundled names when
    neither exists.
    """
    if not name_or_dir or not name_or_dir.strip():
        raise ProfileError("no profile given: expected a profile directory or a bundled name")
    as_path = Path(name_or_dir).expanduser()
    if as_path.is_dir():
        return as_path
    root = bundled_profiles_root()
    relative = Path(name_or_dir.strip("/"))
    if not relative.is_absolute() and ".." not in relative.parts:
        candidate = root / relative
        if _is_profile(candidate):
            return candidate
    names = _bundled_names(root)
    known = ", ".join(names) if names else f"none under {root}"
    raise ProfileError(
        f"no profile directory {name_or_dir!r} and no bundled profile of that name "
        f"(bundled: {known})"
    )


def resolve_configured_profile(*, profile: str | None, profile_results_dir: str) -> Path:
    """The profile directory the planner settings select: the bundled ``profile`` name when
    set (it takes the place of the directory), else ``profile_results_dir``."""
    if profile:
        return resolve_profile(profile)
    return Path(profile_results_dir)
