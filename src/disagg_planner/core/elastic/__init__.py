"""Elastic expert parallelism: when to resize a wide-EP engine's data-parallel group, and to what.

A role named by ``elastic_ep`` keeps its replica count; its capacity moves by changing the
data-parallel (DP) size of its engine in place (vLLM elastic EP), in steps of
``elastic_ep_dp_step`` ranks of ``elastic_ep_gpus_per_rank`` GPUs (EP size = DP x TP) between
``elastic_ep_min_dp`` and ``elastic_ep_max_dp``. One tick (every
``throughput_adjustment_interval_seconds``) works as follows; everything is a function of the
arguments and of the traffic history the planner keeps (no clock, no I/O).

1. **Load trend.** The request rate of every observed window in the last
   ``elastic_ep_trend_window_seconds`` is fitted with a least-squares line over the windows'
   midpoints; ``rate(t) = max(0, level + slope (t - now))``. Lengths are the request-weighted
   mean ISL/OSL of the same windows. The one-step predictors of the throughput loop cannot
   see past one interval, and a resize takes longer than that.
2. **Capacity** (the throughput loop's model): ``size_prefill``/``size_decode`` (summed for an
   aggregated engine, as ``size_agg`` does) give the GPU-seconds one request needs at the trend's
   ISL/OSL and the ITL target, ``g``; one DP rank serves ``gpus_per_rank / g`` requests/s and a
   load ``r`` needs ``ceil(r g / gpus_per_rank)`` ranks, rounded up to the step grid
   ``min_dp + k * dp_step``. Per-rank throughput is taken as independent of the DP size
   (an assumption: the all-to-all grows with EP, the profile was measured at one size).
3. **Lead time.** A grow started now is active ``follower + up.total_s`` later: ``follower``
   is the follower pods' start-up plus their GPUs joining the engine's Ray cluster (only with
   ``elastic_ep_follower_service``: without it the GPUs are already there), ``up.total_s`` the
   resize itself (the mode's :class:`disagg_planner.profiles.elastic_resize.ResizeTiming`).
   Both are the median of the last resizes this planner measured (:meth:`ElasticPlanner.
   observe_resize`) once it has any, configured until then (``elastic_ep_follower_ready_seconds``,
   ``elastic_ep_timing`` or the mode's defaults). *When* to grow: a grow decided at the next
   tick would be active ``lead = follower + up.total_s + interval`` from now, so the planner
   grows now when the peak forecast over ``[now, now + lead]``, plus the backlog's drain
   rate, needs more ranks than it has. *How far*: a resize in flight holds the next one
   (``resize_in_flight``), so the grow started now is corrected no earlier than by a second
   grow decided at the first tick after it is active, which is active one
   ``follower + up.total_s`` later again: the size chosen carries the peak forecast over
   ``[now, now + lead + follower + up.total_s]`` (``hold_s``), plus the backlog's drain
   rate. Sized for its own lead time only, the first grow of a steady rise was outrun by the
   rise before the second could land, and the queue it left stayed.

   **Backlog.** The work already waiting, by the throughput loop's rule
   (:func:`disagg_planner.core.rules.backlog_tokens`, on the same observations): the
   elastic role's engines' queued prefill tokens from FPM where they report, else the
   frontend's in-flight requests beyond ``rate x`` (TTFT target + OSL x ITL target), counted
   at the trend's ISL. As there, it is drained within ``backlog_drain_seconds``: the size
   carries ``backlog / ISL / backlog_drain_seconds`` req/s on top of the forecast, each
   waiting request at the role's own GPU-seconds per request (prefill and decode for an
   aggregated engine). Without it, a queue left by an interval of under-capacity is never
   sized for, and once behind the engine stays behind.
4. **Worth it (scale-up).** Serving stops for the last ``downtime_s`` of the resize, and vLLM
   answers every request arriving meanwhile with 503: they are rejected,
   ``cost = rate(pause) * downtime``. When the frontend retries them
   (``elastic_ep_frontend_retries``) they are only delayed, and lost to the SLO only past what
   the TTFT target absorbs: ``cost = rate(pause) * max(0, downtime - slack)`` with
   ``slack = TTFT target - observed TTFT``. Without the resize, every arrival while the
   forecast load exceeds the current capacity is lost:
   ``benefit = integral of rate(t) where rate(t) > capacity(current)`` over
   ``elastic_ep_benefit_window_seconds`` after the new capacity would be active, plus the
   backlog's requests (waiting already, and not drained in time at the current size: a
   lower bound of what is lost behind them). The planner resizes only when
   ``benefit > cost``: with a blocking resize (~100 s paused) only a sustained overload
   pays; with NIXL EP (< 1 s) any overload does.
5. **Scale-down.** The smaller size must carry the larger of the peak forecast over
   ``[now, now + down.total_s + interval + follower + up.total_s]`` (long enough to grow
   back before a renewed rise arrives) and the highest rate observed in the trend window (the
   drop must be sustained). Never while a backlog remains (``hold_scale_down_backlog``):
   the smaller size would drain it slower, and its pause would stop the drain. A shrink
   whose downtime exceeds the TTFT slack while requests arrive costs SLO for no SLO gain,
   so it waits for idle traffic (blocking and async modes); a NIXL-EP shrink (~2 s) is free
   only when the frontend retries (else its 503s cost requests too).

GPU budget: the planner's one rule (:func:`disagg_planner.core.budget.apply_gpu_budget`), with
the GPUs of the planner's other roles counted: ``max_gpu_budget`` caps the size,
``min_gpu_budget`` floors it (on the grid); when not even the leader's ranks fit, the policy
holds (``gpu_budget_guard_hold``).

The files, one idea each:

| file | holds |
|---|---|
| ``planner.py`` | :class:`ElasticPlanner`: the stages of a tick (its module doc lists them) |
| ``decision.py`` | :class:`ElasticDecision`, :class:`ElasticReason`, :class:`ElasticDiagnostics` |
| ``trend.py`` | :class:`LoadTrend` and its fit to the recent windows (step 1) |
| ``capacity.py`` | GPU-seconds per request (step 2), the backlog (step 3), the ranks a load needs |
| ``timing.py`` | the mode's resize timing, what the planner measured of its resizes (step 3) |
| ``grid.py`` | :class:`DpGrid`: the DP sizes allowed by the step grid and the GPU budget |
"""

from disagg_planner.core.elastic.capacity import RequestCost, request_gpu_seconds
from disagg_planner.core.elastic.decision import ElasticDecision, ElasticDiagnostics, ElasticReason
from disagg_planner.core.elastic.planner import ElasticPlanner
from disagg_planner.core.elastic.timing import mode_timing, pause_contradiction
from disagg_planner.core.elastic.trend import LoadTrend, fit_trend

__all__ = [
    "ElasticDecision",
    "ElasticDiagnostics",
    "ElasticPlanner",
    "ElasticReason",
    "LoadTrend",
    "RequestCost",
    "fit_trend",
    "mode_timing",
    "pause_contradiction",
    "request_gpu_seconds",
]
