"""Bundled profile registry: root, listing, resolution by name or directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from disagg_planner import profiles
from disagg_planner.profiles import (
    ProfileError,
    ProfileManifest,
    bundled_profiles_root,
    list_bundled,
    resolve_profile,
    write_profile,
)
from disagg_planner.profiles.registry import resolve_configured_profile
from tests.unit.profiles.engine_model import Engine

MANIFEST = ProfileManifest(
    model="llama-3.1-8b-fp8", gpu="h200_sxm", backend="vllm", source="modelled"
)


def write_engine_profile(directory: Path, manifest: ProfileManifest | None = None) -> Path:
    a = Engine().arrays()
    return write_profile(
        directory,
        prefill_isl=a["prefill_isl"],
        prefill_ttft_ms=a["prefill_ttft"],
        prefill_thpt_per_gpu=a["prefill_thpt_per_gpu"],
        decode_kv_usage=a["x_kv_usage"],
        decode_context_length=a["y_context_length"],
        decode_itl_ms=a["z_itl"],
        decode_thpt_per_gpu=a["z_thpt_per_gpu"],
        max_kv_tokens=int(a["max_kv_tokens"][0]),
        manifest=manifest,
    )


@pytest.fixture
def bundled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "profiles"
    write_engine_profile(root / "h200_sxm/vllm/llama-3.1-8b-fp8/tp1", MANIFEST)
    write_engine_profile(root / "a100_sxm/sglang/qwen3-32b/tp2")
    (root / "notes").mkdir()
    (root / "README.md").write_text("# profiles\n")
    monkeypatch.setenv("PLANNER_PROFILES_DIR", str(root))
    return root


def test_default_root_is_the_packages_bundled_folder() -> None:
    root = bundled_profiles_root()
    assert root == Path(profiles.__file__).resolve().parent / "bundled"
    assert (root / "README.md").is_file()


def test_list_bundled_finds_profiles_with_their_manifests(bundled: Path) -> None:
    assert bundled_profiles_root() == bundled
    assert list_bundled() == [
        ("a100_sxm/sglang/qwen3-32b/tp2", None),
        ("h200_sxm/vllm/llama-3.1-8b-fp8/tp1", MANIFEST),
    ]


def test_resolve_by_name_and_by_directory(bundled: Path, tmp_path: Path) -> None:
    name = "h200_sxm/vllm/llama-3.1-8b-fp8/tp1"
    assert resolve_profile(name) == bundled / name
    own = write_engine_profile(tmp_path / "mine")
    assert resolve_profile(str(own)) == own
    assert resolve_configured_profile(profile=name, profile_results_dir="ignored") == (
        bundled / name
    )
    assert resolve_configured_profile(profile=None, profile_results_dir=str(own)) == own


def test_unknown_name_lists_the_bundled_ones(bundled: Path) -> None:
    with pytest.raises(ProfileError) as info:
        resolve_profile("h100/vllm/nope/tp1")
    assert str(info.value) == (
        "no profile directory 'h100/vllm/nope/tp1' and no bundled profile of that name "
        "(bundled: a100_sxm/sglang/qwen3-32b/tp2, h200_sxm/vllm/llama-3.1-8b-fp8/tp1)"
    )
    with pytest.raises(ProfileError, match="no profile given"):
        resolve_profile(" ")
    # A folder that groups profiles is not itself one.
    with pytest.raises(ProfileError, match="no bundled profile of that name"):
        resolve_profile("h200_sxm/vllm")


def test_missing_root_lists_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANNER_PROFILES_DIR", str(tmp_path / "absent"))
    assert list_bundled() == []
    with pytest.raises(ProfileError, match=r"\(bundled: none under .*absent\)"):
        resolve_profile("x")


def test_every_bundled_profile_in_the_repository_loads() -> None:
    bundled = list_bundled()
    assert bundled, "profiles/ should hold bundled profiles"
    for name, manifest in bundled:
        profile = profiles.load_profile(resolve_profile(name))
        assert profile.manifest == manifest
        assert profile.decode.find_best_throughput_per_gpu(1e6, 1024).feasible
