"""Several policies of one replay, in parallel processes, with one progress bar.

The references every summary compares with (the oracle, the best static deployment, the fluid
bound: :mod:`disagg_planner.replay.bounds`) are found once, in a thread of this process,
while the policies that need none to run (all but ``oracle`` and ``best-static``) simulate in
the worker processes; each of those waits for them only to write its summary, and the oracle
and best-static policies, which need them to start, are handed them then. No policy searches
again. Every policy runs exactly as :func:`disagg_planner.replay.session.run` runs it alone,
so its outputs do not depend on ``jobs`` (the simulator is deterministic for a seed; only
``wall_s`` differs); with ``jobs`` 1 all of it runs in this process, one after the other.

The bar (:mod:`disagg_planner.replay.progress`) counts simulated seconds over all policies
(each policy's span is its last arrival), with an ETA from the rate so far. Every run starts
with one line giving its size (requests, simulated span, policies).
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import multiprocessing
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from disagg_planner.errors import SpecError
from disagg_planner.replay.bounds import (
    References,
    adopt_references,
    compute_references,
    references_key,
)
from disagg_planner.replay.comparison import write_comparison
from disagg_planner.replay.comparison_model import REFERENCE_POLICIES
from disagg_planner.replay.plan import ReplayPlan
from disagg_planner.replay.progress import REDRAW_S, RunProgress, size_line
from disagg_planner.replay.runner import ReplayResult
from disagg_planner.replay.session import ORACLE_WINDOW_S, make_policy, run

log = logging.getLogger(__name__)


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity, where the OS says)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def resolve_jobs(jobs: int | None, *, flag: str = "--jobs") -> int:
    """``jobs`` checked (None: the number of cores)."""
    if jobs is None:
        return available_cores()
    if jobs < 1:
        raise SpecError(f"{flag} {jobs}: expected a number of parallel processes, 1 or more")
    return jobs


def output_dir_for(out_dir: Path, policy: str, policies: Sequence[str]) -> Path:
    """Where one policy's files go: ``out_dir`` itself for a single policy."""
    if len(policies) == 1:
        return out_dir
    return out_dir / policy.replace(":", "-").replace(",", "-")


def run_policies(
    plan: ReplayPlan,
    policies: Sequence[str],
    *,
    out_dir: Path | None,
    jobs: int | None = 1,
    progress: bool = True,
    stream: TextIO | None = None,
    references: bool = True,
) -> list[ReplayResult]:
    """Run ``policies`` on ``plan`` in up to ``jobs`` processes (None: one per core), in
    the order given; with ``out_dir``, each writes its files there (see
    :func:`output_dir_for`), and with several policies ``comparison.html`` goes to
    ``out_dir``. ``progress``: the bar (on a terminal). ``references``: False skips the
    references' searches (the summaries compare with nothing; the oracle and best-static
    policies are refused)."""
    if not references:
        searched = [name for name in policies if name in REFERENCE_POLICIES]
        if searched:
            raise SpecError(
                f"--no-references skips the searches that policy {searched[0]!r} is: drop "
                "it, or drop --no-references"
            )
    results = _run_all(
        plan,
        policies,
        out_dir=out_dir,
        jobs=jobs,
        progress=progress,
        stream=stream,
        references=references,
    )
    if out_dir is not None and len(policies) > 1:
        write_comparison(out_dir, [output_dir_for(out_dir, p, policies) for p in policies])
    return results


def _run_all(
    plan: ReplayPlan,
    policies: Sequence[str],
    *,
    out_dir: Path | None,
    jobs: int | None,
    progress: bool,
    stream: TextIO | None,
    references: bool,
) -> list[ReplayResult]:
    jobs = resolve_jobs(jobs)
    for name in policies:
        if name not in REFERENCE_POLICIES:  # those are the references' searches
            make_policy(name, plan)  # a bad name refused before minutes of searching
    span = max(r.arrival_s for r in plan.requests)
    log.info("%s", size_line(len(plan.requests), span, policies))
    bar = RunProgress(len(policies), span, stream=stream, enabled=progress)
    dirs = [None if out_dir is None else output_dir_for(out_dir, p, policies) for p in policies]
    if jobs == 1 or not references:
        if references:
            bar.note("finding the references (oracle plan, best static deployment, fluid bound)")
            compute_references(plan, window_s=ORACLE_WINDOW_S)
        return _run_here_or_apart(plan, policies, dirs, bar, jobs=jobs, references=references)
    # The policies that need no reference to run start at once; the references are found
    # meanwhile, in a thread of this process, and handed to each of them when its simulation
    # ends (its summary compares with them), then to the oracle and best-static policies,
    # which start only then.
    early = [i for i, name in enumerate(policies) if name not in REFERENCE_POLICIES]
    late = [i for i, name in enumerate(policies) if name in REFERENCE_POLICIES]
    context = multiprocessing.get_context()
    reports = context.SimpleQueue()
    handed = context.SimpleQueue()  # the references, one copy per early policy
    key = references_key(plan, window_s=ORACLE_WINDOW_S)
    pending: dict[concurrent.futures.Future[ReplayResult], int] = {}
    by_index: dict[int, ReplayResult] = {}
    bar.note(
        "finding the references (oracle plan, best static deployment, fluid bound)"
        + (" while the other policies run" if early else "")
    )
    searcher = concurrent.futures.ThreadPoolExecutor(1)
    bar.searching = True
    handed_over = False
    with _pool(context, min(jobs, len(policies)), (plan, key, reports, handed)) as pool:
        try:
            for i in early:
                pending[pool.submit(_run_in_worker, i, policies[i], dirs[i], None)] = i
            finding: concurrent.futures.Future[References] | None = searcher.submit(
                compute_references, plan, window_s=ORACLE_WINDOW_S
            )
            while pending or finding is not None:
                watched: list[concurrent.futures.Future[Any]] = list(pending)
                if finding is not None:
                    watched.append(finding)
                done, _ = concurrent.futures.wait(
                    watched, timeout=REDRAW_S, return_when=concurrent.futures.FIRST_COMPLETED
                )
                _drain(reports, bar)
                bar.tick()
                if finding is not None and finding.done():
                    handed_over = True
                    bar.searching = False
                    refs = _hand_over(finding, handed, len(early))
                    finding = None
                    for i in late:
                        pending[pool.submit(_run_in_worker, i, policies[i], dirs[i], refs)] = i
                for future in done:
                    if future in pending:
                        i = pending.pop(future)
                        by_index[i] = future.result()
                        bar.finish(i)
        finally:
            if not handed_over:
                # a policy failed first: the others waiting for the references stop too,
                # and those not started yet do not start
                for future in pending:
                    future.cancel()
                for _ in early:
                    handed.put(None)
            searcher.shutdown(wait=False, cancel_futures=True)
    bar.close()
    return [by_index[i] for i in range(len(policies))]


def _run_here_or_apart(
    plan: ReplayPlan,
    policies: Sequence[str],
    dirs: Sequence[Path | None],
    bar: RunProgress,
    *,
    jobs: int,
    references: bool,
) -> list[ReplayResult]:
    """The policies, the references found already or not wanted: one after the other in
    this process (``jobs`` 1), or in ``jobs`` processes."""
    if jobs == 1:
        results = []
        for i, name in enumerate(policies):
            results.append(
                run(plan, name, out_dir=dirs[i], progress=bar.callback(i), references=references)
            )
            bar.finish(i)
        bar.close()
        return results
    context = multiprocessing.get_context()
    reports = context.SimpleQueue()
    key = references_key(plan, window_s=ORACLE_WINDOW_S)
    by_index: dict[int, ReplayResult] = {}
    with _pool(context, min(jobs, len(policies)), (plan, key, reports, None)) as pool:
        pending = {
            pool.submit(_run_in_worker, i, name, dirs[i], None, references=False): i
            for i, name in enumerate(policies)
        }
        while pending:
            done, _ = concurrent.futures.wait(
                list(pending), timeout=REDRAW_S, return_when=concurrent.futures.FIRST_COMPLETED
            )
            _drain(reports, bar)
            bar.tick()
            for future in done:
                i = pending.pop(future)
                by_index[i] = future.result()
                bar.finish(i)
    bar.close()
    return [by_index[i] for i in range(len(policies))]


def _pool(
    context: Any, workers: int, install: tuple[ReplayPlan, str, Any, Any]
) -> concurrent.futures.ProcessPoolExecutor:
    """The worker processes, each given the plan, the references' key, the progress queue
    and the queue the references are handed over on (:func:`_install`)."""
    return concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=context, initializer=_install, initargs=install
    )


def _hand_over(
    finding: concurrent.futures.Future[References], handed: Any, copies: int
) -> References:
    """The references found, put on ``handed`` once for each early policy; where finding
    them failed, ``None`` instead (each of those policies stops), and the error raised."""
    try:
        refs = finding.result()
    except BaseException:
        for _ in range(copies):
            handed.put(None)
        raise
    for _ in range(copies):
        handed.put(refs)
    return refs


def _drain(reports: Any, bar: RunProgress) -> None:
    latest: dict[int, float] = {}
    while not reports.empty():
        run_index, now_s = reports.get()
        latest[run_index] = now_s
    for run_index, now_s in latest.items():
        bar.update(run_index, now_s)


# --- in the worker processes ---------------------------------------------------------------

_WORKER: dict[str, Any] = {}


def _install(plan: ReplayPlan, key: str, reports: Any, handed: Any) -> None:
    _WORKER.update(plan=plan, key=key, reports=reports, handed=handed)


def _references_handed() -> References:
    """The references the parent found, once it has (an early policy waits here when its
    simulation is over)."""
    refs = _WORKER["handed"].get()
    if refs is None:
        raise RuntimeError("finding the references failed (the main process says why)")
    adopt_references(_WORKER["key"], refs)
    return refs


def _run_in_worker(
    index: int,
    name: str,
    out_dir: Path | None,
    refs: References | None,
    *,
    references: bool = True,
) -> ReplayResult:
    """Run policy ``name``: with ``refs`` (an oracle or best-static policy, which needs them
    to start), or else waiting for them only when its simulation is over (``references``
    False: compared with none)."""
    reports = _WORKER["reports"]
    step = 0.005 * max(r.arrival_s for r in _WORKER["plan"].requests)
    last = [-math.inf]

    def report(now_s: float, _span_s: float) -> None:
        # every half per cent: the parent redraws a few times a second at most anyway
        if now_s - last[0] >= step:
            last[0] = now_s
            reports.put((index, now_s))

    if not references:
        return run(_WORKER["plan"], name, out_dir=out_dir, progress=report, references=False)
    if refs is not None:
        adopt_references(_WORKER["key"], refs)
        return run(_WORKER["plan"], name, out_dir=out_dir, progress=report)
    return run(
        _WORKER["plan"], name, out_dir=out_dir, progress=report, references=_references_handed
    )
