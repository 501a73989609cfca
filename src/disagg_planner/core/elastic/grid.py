"""The DP sizes an elastic engine may take: the step grid ``min_dp + k * dp_step`` between
``elastic_ep_min_dp`` and ``elastic_ep_max_dp``, within the planner's GPU budget (the package
doc's last paragraph)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.core.budget import BudgetResult, apply_gpu_budget


@dataclass(frozen=True)
class DpGrid:
    """The grid of one elastic role and the GPU budget it shares with the other roles."""

    role: str
    min_dp: int
    max_dp: int
    step: int
    gpus_per_rank: int
    max_gpu_budget: int
    min_gpu_budget: int

    @classmethod
    def of(cls, config: PlannerConfig, *, role: str, max_dp: int) -> DpGrid:
        return cls(
            role=role,
            min_dp=config.elastic_ep_min_dp,
            max_dp=max_dp,
            step=config.elastic_ep_dp_step,
            gpus_per_rank=config.elastic_ep_gpus_per_rank,
            max_gpu_budget=config.max_gpu_budget,
            min_gpu_budget=config.min_gpu_budget,
        )

    def budget(self, dp: int, other_gpus: int) -> BudgetResult:
        """The planner's GPU-budget rule applied to DP size ``dp``: the engine is one role
        counted in steps of ``dp_step`` ranks above the leader's, whose GPUs count with the
        other roles' (the rule never removes them)."""
        return apply_gpu_budget(
            {self.role: (dp - self.min_dp) // self.step},
            gpus_per_replica={self.role: self.step * self.gpus_per_rank},
            floors={self.role: 0},
            max_gpus=self.max_gpu_budget,
            min_gpus=self.min_gpu_budget,
            order=(self.role,),
            other_gpus=other_gpus + self.min_dp * self.gpus_per_rank,
        )

    def on_budget_grid(self, dp: int, other_gpus: int) -> int:
        """``dp`` fitted to the GPU budget, on the grid; ``dp`` itself when the budget holds."""
        fitted = self.budget(dp, other_gpus)
        return dp if fitted.hold else self.min_dp + fitted.replicas[self.role] * self.step

    def max_dp_within_budget(self, other_gpus: int) -> int:
        """``elastic_ep_max_dp``, lowered to what ``max_gpu_budget`` leaves (on the grid);
        the leader's ranks when not even they fit (they exist regardless of the budget)."""
        if self.budget(self.max_dp, other_gpus).hold:
            return self.min_dp
        return min(self.max_dp, self.on_budget_grid(self.max_dp, other_gpus))

    def min_dp_within_budget(self, other_gpus: int) -> int:
        """``elastic_ep_min_dp``, raised to what ``min_gpu_budget`` asks (on the grid), never
        above :meth:`max_dp_within_budget`."""
        return min(
            self.on_budget_grid(self.min_dp, other_gpus), self.max_dp_within_budget(other_gpus)
        )

    def on_grid(self, ranks: int, top: int) -> int:
        """The smallest grid size ``min_dp + k * step`` >= ``ranks``, within [min_dp, top]."""
        if ranks <= self.min_dp:
            return self.min_dp
        k = math.ceil((ranks - self.min_dp) / self.step)
        return min(top, self.min_dp + k * self.step)
