"""What an enqueue of the job features must be, checked before anything is logged: results
(one per job, from its lease holder, kept for a time, into a results queue only) and
dependencies (on jobs that exist or are done, none failed, within the caps)."""

from __future__ import annotations

from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument, LeaseExpired, TooManyItems
from blizzard.wire.limits import MAX_DEPENDENCIES
from blizzard.wire.queue_settings import RESULTS_SUFFIX
from master.state.job_book import MAX_EDGES, MAX_RESULTS
from master.state.job_book import MAX_WAITING as MAX_WAITING_JOBS
from master.state.machine import State


def check_results(state: State, msg: p.Enqueue, n: int, retry: bool) -> None:
    """Results go to a results queue, one job each, kept for a time (their delay), and
    nothing else goes there."""
    results_queue = msg.queue.endswith(RESULTS_SUFFIX)
    if not msg.result_of:
        if results_queue:
            raise InvalidArgument(f"queue {msg.queue} holds task results (its name ends "
                                  f"{RESULTS_SUFFIX}); read them with handle.result() or "
                                  "`blizzard job ID`")
        return
    if not results_queue:
        raise InvalidArgument(f"results go to a queue whose name ends {RESULTS_SUFFIX}")
    if msg.hold or len(msg.result_of) != n or len(set(msg.result_of)) != n:
        raise InvalidArgument("results are enqueued, not staged, one per job")
    if len(msg.result_leases) != n:
        raise InvalidArgument("a result names its job's lease token: one per job")
    if not retry:
        lease_of = state.lease_of
        stale = [job for job, lease in zip(msg.result_of, msg.result_leases, strict=True)
                 if lease_of(job) != lease]
        if stale:
            raise LeaseExpired(f"jobs {stale[:10]} are not leased under the tokens given: "
                               "only who holds a job's lease stores its result")
    if msg.result_kind not in (p.RESULT_DONE, p.RESULT_FAILED, p.RESULT_CANCELLED):
        raise InvalidArgument(f"result_kind {msg.result_kind} is none of 0 (done), 1 "
                              "(failed), 2 (cancelled)")
    if n and min(msg.delays) <= 0:
        raise InvalidArgument("a result's delay is its time to live: it must be positive")
    if msg.uniques or msg.ttrs or msg.coalesce:
        raise InvalidArgument("results take no unique keys, leases or coalescing")
    held = len(state.jobs.results)
    if held + n > MAX_RESULTS:
        raise TooManyItems(f"the master keeps {held} results, at most {MAX_RESULTS}: "
                           "keep them for less time (result_ttl_s)")


def check_dependencies(state: State, msg: p.Enqueue, n: int) -> None:
    """Each job depended on exists, or is done; none has failed; the waiting jobs fit."""
    if msg.hold or msg.result_of:
        raise InvalidArgument("dependencies are for enqueues, not staged items or results")
    if len(msg.depends_on) > MAX_DEPENDENCIES:
        raise TooManyItems(f"a job may depend on at most {MAX_DEPENDENCIES} jobs, not "
                           f"{len(msg.depends_on)} (a group's callback: chain groups)")
    if msg.on_dependency_failure not in (p.DEPENDENCY_CANCEL, p.DEPENDENCY_DEAD):
        raise InvalidArgument(f"on_dependency_failure {msg.on_dependency_failure} is none "
                              "of 0 (cancel) and 1 (dead-letter)")
    jobs = state.jobs
    for parent in msg.depends_on:
        if parent in state.items and parent not in jobs.result_jobs:
            if parent in state.origins:
                raise InvalidArgument(f"job {parent} is dead: a job that depends on it "
                                      "would never run")
            continue
        result = jobs.results.get(parent)
        if parent in jobs.recent_cancels or (result is not None and result.kind):
            raise InvalidArgument(f"job {parent} ended dead or cancelled: a job that "
                                  "depends on it would never run")
        if result is None and parent not in state.recent_acks:
            raise InvalidArgument(f"no job {parent} is known to the master (never made, "
                                  "or finished so long ago that it was forgotten): a job "
                                  "cannot depend on it")
    if len(jobs.waiting) + n > MAX_WAITING_JOBS:
        raise TooManyItems(f"{len(jobs.waiting)} jobs wait for dependencies; the master "
                           f"holds at most {MAX_WAITING_JOBS}")
    if jobs.edges + n * len(msg.depends_on) > MAX_EDGES:
        raise TooManyItems(f"jobs wait for {jobs.edges} (job, dependency) pairs; the master "
                           f"holds at most {MAX_EDGES}: fewer dependencies per job (a "
                           "group's callback can wait on a job that waits on the group)")
