"""``planner operator`` killed with SIGKILL at each step of a scale-up and started again (a
crashed pod, or the other replica taking over): the new process reads the planner's state
back from the DGD and makes no spurious write (issue 19, problem 3: the restarted operator's
first tick patched a larger count while the last change's pods were still pending).

The stack: :mod:`tests.e2e.small_stack`.
"""

from __future__ import annotations

import pytest

from tests.e2e.small_stack import INTERVAL_S, Stack
from tests.unit.observe.canned_prometheus import vector_reply
from tests.unit.runtime.conftest import traffic_parts

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("step", ["pending", "partly_ready", "converged"])
def test_a_sigkilled_operator_resumes_without_a_spurious_write(stack: Stack, step: str) -> None:
    # The scale-up: 10 req/s needs more prefill workers than the one running.
    (first,) = stack.wait(
        lambda: stack.replica_writes() or None, what="the scale-up", timeout_s=120
    )
    target = first["data"]["spec"]["services"]["prefill"]["replicas"]
    assert target > 1, first
    if step == "partly_ready":
        stack.set_ready({"prefill": target - 1, "decode": 1})
    elif step == "converged":
        stack.set_ready({"prefill": target, "decode": 1})
    stack.operator.kill()
    writes_before = len(stack.replica_writes())
    mark_requests = len(stack.kmock.requests())
    if step != "converged":
        # A re-plan from the ready workers would now want more than the change under way.
        stack.prometheus.reply = vector_reply(traffic_parts(30.0, INTERVAL_S))

    stack.operator.start()
    mark = stack.operator.log_size()
    lines = stack.wait(
        lambda: found if len(found := stack.throughput_lines(mark)) >= 3 else None,
        what="three throughput ticks of the restarted operator",
        timeout_s=120,
    )
    assert stack.replica_writes(mark_requests) == [], "\n".join(lines)
    assert len(stack.replica_writes()) == writes_before
    assert stack.desired()["prefill"] == target
    if step == "converged":
        assert all(" [summary] HOLD | " in line for line in lines), lines
        return
    # It says why it waits: the change read back from the DGD has not converged.
    assert all("throughput_reason=scaling_in_progress" in line for line in lines), lines
    assert any("awaiting_convergence" in line for line in lines), lines

    # The workers become ready: planning resumes within two intervals and sizes for the
    # higher traffic.
    stack.set_ready({"prefill": target, "decode": 1})
    (resumed,) = stack.wait(
        lambda: stack.replica_writes(mark_requests) or None,
        what="planning to resume once the change converged",
        timeout_s=60,
    )
    assert resumed["data"]["spec"]["services"]["prefill"]["replicas"] > target
