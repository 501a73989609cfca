"""The performance profile: where the throughput loop's capacity per replica comes from."""

from __future__ import annotations

from pydantic import BaseModel, Field

from disagg_planner.config.sections.meta import field_meta


class ProfileSection(BaseModel):
    """The performance profile (a directory of results, or a bundled one by name)."""

    profile_results_dir: str = Field(
        "profiling_results",
        description="Directory of pre-deployment profiling results (Dynamo's NPZ layout).",
        json_schema_extra=field_meta("profile"),
    )
    profile: str | None = Field(
        None,
        description="Name of a bundled profile (e.g. h200_sxm/vllm/llama-3.1-8b-fp8/tp1); "
        "takes the place of --profile-results-dir.",
        json_schema_extra=field_meta("profile"),
    )
