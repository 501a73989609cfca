"""Budgets and replica floors: the GPUs one deployment may use, the replicas each role keeps,
and the fleet's GPU pool it may share with other deployments."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from disagg_planner.config.sections.meta import field_meta


class BudgetSection(BaseModel):
    """GPU budgets, replica floors and the fleet's pool."""

    max_gpu_budget: int = Field(
        8,
        description="Most GPUs the managed roles may use together; -1 for no limit.",
        json_schema_extra=field_meta("budget"),
    )
    min_gpu_budget: int = Field(
        -1,
        description="Fewest GPUs the managed roles keep together; -1 for no floor.",
        json_schema_extra=field_meta("budget"),
    )
    min_endpoint: int = Field(
        1,
        ge=0,
        description="Fewest replicas of each scaled role (0 allows scale to zero).",
        json_schema_extra=field_meta("budget"),
    )
    prefill_min_endpoint: int | None = Field(
        None,
        ge=1,
        description="Fewest prefill replicas; overrides --min-endpoint for prefill.",
        json_schema_extra=field_meta("budget"),
    )
    decode_min_endpoint: int | None = Field(
        None,
        ge=1,
        description="Fewest decode replicas; overrides --min-endpoint for decode.",
        json_schema_extra=field_meta("budget"),
    )

    # --- fleet: a GPU pool shared with other deployments (operator) --------------------
    pool: str | None = Field(
        None,
        min_length=1,
        description="Name of the PlannerPool (in the policy's namespace) whose GPUs this "
        "deployment shares with the pool's other members; its arbiter grants this "
        "deployment's GPUs by floor, priority and urgency, and max_gpu_budget still caps it. "
        "Served by `planner operator` only (`planner run` and single replays refuse it; "
        "`planner replay --fleet` replays a pool).",
        json_schema_extra=field_meta("budget"),
    )
    pool_priority: int = Field(
        0,
        description="Priority in the pool: needs above floors are served higher first.",
        json_schema_extra=field_meta("budget"),
    )
    pool_floor_gpus: int = Field(
        0,
        ge=0,
        description="GPUs of the pool this deployment is guaranteed (its floor): served "
        "first, lent to equal or higher priorities while idle, reclaimed at once.",
        json_schema_extra=field_meta("budget"),
    )
    pool_ceiling_gpus: int | None = Field(
        None,
        ge=0,
        description="Most GPUs of the pool this deployment is granted (null: the pool's).",
        json_schema_extra=field_meta("budget"),
    )

    @field_validator("max_gpu_budget", "min_gpu_budget")
    @classmethod
    def _budget(cls, value: int) -> int:
        if value != -1 and value < 1:
            raise ValueError("must be -1 (no limit) or a positive number of GPUs")
        return value

    def min_endpoint_for(self, role: str) -> int:
        """The replica floor of ``role`` (per-role setting, else the global one)."""
        if role == "prefill" and self.prefill_min_endpoint is not None:
            return self.prefill_min_endpoint
        if role == "decode" and self.decode_min_endpoint is not None:
            return self.decode_min_endpoint
        return self.min_endpoint
