"""Profile library: reads pre-deployment performance profiles (Dynamo's NPZ/JSON layout) and
answers how much prefill and decode capacity one GPU gives under a TTFT or ITL target.

It imports nothing from the other project packages.
"""

from interpolation.decode import DecodeBest, DecodeBestMany, DecodeInterpolator, DecodePoint
from interpolation.errors import ProfileError
from interpolation.manifest import EngineShape, ProfileManifest, load_manifest
from interpolation.prefill import PrefillInterpolator, PrefillPoint
from interpolation.profile import Profile, load_profile
from interpolation.registry import bundled_profiles_root, list_bundled, resolve_profile
from interpolation.storage import write_profile

__all__ = [
    "DecodeBest",
    "DecodeBestMany",
    "DecodeInterpolator",
    "DecodePoint",
    "EngineShape",
    "PrefillInterpolator",
    "PrefillPoint",
    "Profile",
    "ProfileError",
    "ProfileManifest",
    "bundled_profiles_root",
    "list_bundled",
    "load_manifest",
    "load_profile",
    "resolve_profile",
    "write_profile",
]
