"""Elastic expert parallelism: how long resizing one engine's data-parallel group takes.

These are facts about the engine (vLLM elastic EP), not about a simulation: the planner's
elastic policy plans its lead time and downtime cost with them, and the simulator plays a
resize with them, so both read them from here.

A resize has a preparation phase, during which the engine keeps serving at its old size
(joining workers initialise, communicators are prepared, weights are copied), followed by a
downtime in which no request makes progress while the new topology is activated. The model
is ``(total time, downtime)`` per mode and direction; preparation is ``total - downtime``
(clamped at zero: the measured blocking scale-down reports a downtime 0.04 s longer than its
total).

Defaults are vLLM's published measurements for DeepSeek V4 Pro on GB200, TP1, DP/EP 16 <-> 20
(vLLM blog on Elastic EP with asynchronous preparation and NIXL EP; seed 002):

=====================================  ===========  ===========  ==========  ==========
mode                                   up downtime  down downt.  up total    down total
=====================================  ===========  ===========  ==========  ==========
blocking                               99.62 s      56.25 s      99.72 s     56.21 s
async (background preparation)         58.04 s      44.07 s      97.27 s     51.46 s
nixl_ep (async + CUDA-graph reuse)     0.82 s       1.96 s       92.34 s     9.32 s
=====================================  ===========  ===========  ==========  ==========

They are used unscaled for other sizes and models (an assumption: preparation is dominated
by worker start-up and weight transfer, which run in parallel per joining worker).
"""

from __future__ import annotations

from dataclasses import dataclass

from disagg_planner.profiles.errors import ProfileError

__all__ = ["ALIASES", "MODES", "ElasticEpMode", "ResizeTiming", "mode", "timing"]


@dataclass(frozen=True)
class ResizeTiming:
    """Seconds of one resize: ``total`` from request to new topology, ``downtime`` the
    part during which serving stops (at the end)."""

    total_s: float
    downtime_s: float

    @property
    def preparation_s(self) -> float:
        return max(0.0, self.total_s - self.downtime_s)


@dataclass(frozen=True)
class ElasticEpMode:
    name: str
    up: ResizeTiming
    down: ResizeTiming
    description: str


MODES: dict[str, ElasticEpMode] = {
    "blocking": ElasticEpMode(
        "blocking",
        up=ResizeTiming(total_s=99.72, downtime_s=99.62),
        down=ResizeTiming(total_s=56.21, downtime_s=56.25),
        description="every step while serving is paused",
    ),
    "async": ElasticEpMode(
        "async",
        up=ResizeTiming(total_s=97.27, downtime_s=58.04),
        down=ResizeTiming(total_s=51.46, downtime_s=44.07),
        description="workers, communicators and weights prepared in the background; "
        "warm-up and CUDA-graph capture while paused",
    ),
    "nixl_ep": ElasticEpMode(
        "nixl_ep",
        up=ResizeTiming(total_s=92.34, downtime_s=0.82),
        down=ResizeTiming(total_s=9.32, downtime_s=1.96),
        description="asynchronous preparation with NIXL EP: existing CUDA graphs stay valid, "
        "only the topology switch pauses serving",
    ),
}
ALIASES = {"async_graph_reuse": "nixl_ep", "nixl": "nixl_ep", "async_prepare": "async"}


def mode(name: str) -> ElasticEpMode:
    """The mode called ``name`` (or one of its :data:`ALIASES`), case-insensitive."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in MODES:
        raise ProfileError(
            f"unknown elastic-EP mode; known: {', '.join([*MODES, *ALIASES])}",
            key="elastic_ep_mode",
            value=name,
            has_value=True,
        )
    return MODES[key]


def timing(mode_name: str, *, scale_up: bool) -> ResizeTiming:
    m = mode(mode_name)
    return m.up if scale_up else m.down
