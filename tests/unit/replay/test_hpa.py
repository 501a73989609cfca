"""The HPA baseline behaves as the Kubernetes controller does (defaults of autoscaling/v2)."""

from __future__ import annotations

from disagg_planner.replay.hpa import HorizontalPodAutoscaler, HpaBehavior


def test_within_tolerance_holds() -> None:
    hpa = HorizontalPodAutoscaler(HpaBehavior(target_utilisation=0.5))
    assert hpa.recommend(now_s=0, current=4, utilisation=0.54) == 4


def test_scale_up_is_proportional_and_rate_limited() -> None:
    hpa = HorizontalPodAutoscaler(HpaBehavior(target_utilisation=0.5))
    # wants ceil(2 * 0.95/0.5) = 4: within +100 % / +4 pods
    assert hpa.recommend(now_s=0, current=2, utilisation=0.95) == 4
    # wants 40 from 10: limited to max(20, 14) = 20
    hpa2 = HorizontalPodAutoscaler(HpaBehavior(target_utilisation=0.1))
    assert hpa2.recommend(now_s=0, current=10, utilisation=0.4) == 20


def test_scale_down_waits_for_the_stabilisation_window() -> None:
    hpa = HorizontalPodAutoscaler(HpaBehavior(target_utilisation=0.5))
    assert hpa.recommend(now_s=0, current=8, utilisation=0.5) == 8
    replicas = 8
    for t in range(15, 300, 15):  # load halves: the 300 s window still remembers 8
        replicas = hpa.recommend(now_s=t, current=replicas, utilisation=0.25)
        assert replicas == 8, t
    assert hpa.recommend(now_s=315, current=8, utilisation=0.25) == 4


def test_the_replicas_found_at_the_first_sync_hold_for_the_stabilisation_window() -> None:
    # the controller records what runs when it first sees an HPA: a quiet first sync does
    # not cut a running deployment until the window has passed
    hpa = HorizontalPodAutoscaler(HpaBehavior(target_utilisation=0.5))
    for t in range(0, 300, 15):
        assert hpa.recommend(now_s=t, current=8, utilisation=0.1) == 8, t
    assert hpa.recommend(now_s=315, current=8, utilisation=0.1) == 2


def test_no_metrics_no_action_and_bounds() -> None:
    hpa = HorizontalPodAutoscaler(HpaBehavior(min_replicas=2, max_replicas=5))
    assert hpa.recommend(now_s=0, current=3, utilisation=None) == 3
    assert hpa.recommend(now_s=15, current=3, utilisation=10.0) == 5
