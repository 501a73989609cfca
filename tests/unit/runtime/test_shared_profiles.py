"""The operator's loops share one profile per profile directory (issue 36: a copy per policy,
~3.7 MB of interpolator grids, was most of the memory a policy held)."""

from __future__ import annotations

import gc
import os
from pathlib import Path

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.runtime.service import _PROFILES, _profile_key, load_profile_for
from tests.unit.core.conftest import write_h200_like_profile


def config(profile: Path, name: str) -> PlannerConfig:
    return PlannerConfig(dgd_name=name, backend="vllm", profile_results_dir=str(profile))


def test_policies_naming_one_profile_share_it_and_an_edited_profile_is_read_again(
    tmp_path: Path,
) -> None:
    directory = write_h200_like_profile(tmp_path / "p")
    first = load_profile_for(config(directory, "a"))
    second = load_profile_for(config(directory, "b"))
    assert first is not None and second is first
    # an edit of the profile on disk (a new file version) is a new profile, not the cached one
    some_file = next(p for p in directory.rglob("*") if p.is_file())
    stat = some_file.stat()
    os.utime(some_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    edited = load_profile_for(config(directory, "c"))
    assert edited is not None and edited is not first


def test_a_profile_no_loop_holds_is_freed(tmp_path: Path) -> None:
    directory = write_h200_like_profile(tmp_path / "p")
    profile = load_profile_for(config(directory, "a"))
    assert profile is not None and _profile_key(directory) in _PROFILES
    del profile
    gc.collect()
    assert _profile_key(directory) not in _PROFILES
