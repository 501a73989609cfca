"""Profile library: reads pre-deployment performance profiles (Dynamo's NPZ/JSON layout) and
answers how much prefill and decode capacity one GPU gives under a TTFT or ITL target, and
how long resizing an elastic-EP engine takes (:mod:`disagg_planner.profiles.elastic_resize`).

It imports nothing else of the package (an import-linter contract).
"""

from disagg_planner.profiles.decode import (
    DecodeBest,
    DecodeBestMany,
    DecodeInterpolator,
    DecodePoint,
)
from disagg_planner.profiles.elastic_resize import ElasticEpMode, ResizeTiming
from disagg_planner.profiles.errors import ProfileError
from disagg_planner.profiles.manifest import EngineShape, ProfileManifest, load_manifest
from disagg_planner.profiles.prefill import PrefillInterpolator, PrefillPoint
from disagg_planner.profiles.profile import Profile, load_profile
from disagg_planner.profiles.registry import bundled_profiles_root, list_bundled, resolve_profile
from disagg_planner.profiles.storage import write_profile

__all__ = [
    "DecodeBest",
    "DecodeBestMany",
    "DecodeInterpolator",
    "DecodePoint",
    "ElasticEpMode",
    "EngineShape",
    "PrefillInterpolator",
    "PrefillPoint",
    "Profile",
    "ProfileError",
    "ProfileManifest",
    "ResizeTiming",
    "bundled_profiles_root",
    "list_bundled",
    "load_manifest",
    "load_profile",
    "resolve_profile",
    "write_profile",
]
