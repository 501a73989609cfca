"""The scheduler's records: the waiting queue's totals and a planned decode run's timeline.

The golden replays pin the whole scheduler; these pin the pieces a change is most likely to
get wrong on its own: which section of the FPM a queued request counts in, and where a run
is cut when a request arrives.
"""

from __future__ import annotations

import statistics

import pytest

from disagg_planner.simulator.decode_run import DecodeRun, fit_run
from disagg_planner.simulator.iteration import EMPTY_QUEUE, QueueTotals
from disagg_planner.simulator.request import SimRequest


def _request(
    rid: int, isl: int, *, computed: int = 0, generated: int = 0, preempted: bool = False
) -> SimRequest:
    req = SimRequest(rid=rid, arrival_s=0.0, isl=isl, osl=100, hash_ids=None)
    req.computed = computed
    req.generated = generated
    req.prompt_len = isl + generated
    req.preemptions = 1 if preempted else 0
    return req


def test_queued_requests_count_in_and_out_back_to_an_empty_queue() -> None:
    totals = QueueTotals()
    reqs = [
        _request(1, 300),
        _request(2, 500, computed=100),
        _request(3, 40, generated=9, preempted=True),
    ]
    for r in reqs:
        totals.add(r, 1)
    for r in reqs:
        totals.add(r, -1)
    assert totals.snapshot() == EMPTY_QUEUE


@pytest.mark.parametrize(
    ("req", "section"),
    [
        pytest.param(_request(1, 300), "prefill", id="new request: a queued prefill"),
        pytest.param(_request(2, 300, computed=120), "prefill", id="partly computed: its rest"),
        pytest.param(
            _request(3, 300, generated=5, preempted=True), "decode", id="preempted with output"
        ),
        pytest.param(
            _request(4, 300, preempted=True), "prefill", id="preempted before its first token"
        ),
    ],
)
def test_a_queued_request_counts_in_the_section_of_the_fpm_it_belongs_to(
    req: SimRequest, section: str
) -> None:
    totals = QueueTotals()
    totals.add(req, 1)
    m = totals.snapshot().metrics()
    if section == "prefill":
        assert (m.num_prefill_requests, m.sum_prefill_tokens) == (1, req.prompt_len - req.computed)
        assert m.num_decode_requests == 0
    else:
        assert (m.num_decode_requests, m.sum_decode_kv_tokens) == (1, req.prompt_len)
        assert m.num_prefill_requests == 0


def test_the_queued_section_reports_the_population_variance_of_prompt_lengths() -> None:
    totals = QueueTotals()
    lengths = [100, 250, 4000, 17]
    for i, n in enumerate(lengths):
        totals.add(_request(i, n), 1)
    m = totals.snapshot().metrics()
    assert m.sum_prefill_tokens == sum(lengths)
    assert m.var_prefill_length == pytest.approx(statistics.pvariance(lengths))


def _run() -> DecodeRun:
    return DecodeRun.planned(10.0, [0.5, 0.5, 0.5, 0.5], 1000, 0.0)


def test_a_run_ends_at_the_sum_of_its_iterations() -> None:
    assert _run().ends == [10.5, 11.0, 11.5, 12.0]


def test_an_arrival_cuts_the_run_after_the_iteration_in_progress() -> None:
    run = _run()
    assert run.cut_after(10.7) == 11.0  # the second iteration (10.5-11.0) finishes
    assert run.ends == [10.5, 11.0] and run.durs == [0.5, 0.5]
    assert run.cut_after(10.8) is None  # already ends after that iteration


def test_a_cut_never_drops_iterations_already_accounted() -> None:
    run = _run()
    run.done = 3  # accounted up to 11.5: the iteration in progress is the last
    assert run.cut_after(10.2) is None
    assert run.ends == [10.5, 11.0, 11.5, 12.0]


@pytest.mark.parametrize("free", [0, 1, 5, 17, 60, 1000])
def test_the_longest_run_that_fits_is_found(free: int) -> None:
    def extra_blocks(steps: int) -> int:  # monotone, 0 for the step already allocated
        return (steps - 1) * 3 // 2

    k = 50
    linear = max(s for s in range(1, k + 1) if extra_blocks(s) <= free)
    assert fit_run(k, extra_blocks, free) == linear
