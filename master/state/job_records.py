"""How the job records change the master's state: dependencies settled as jobs end,
cancellations, progress, results running out, schedules armed and re-armed.

Part of ``State.apply`` (``master/state/machine.py``), as functions of the state ``s``: the job
features' share of the state machine, beside the items' and queues' own. What they keep is
``s.jobs`` (``master/state/job_book.py``) and ``s.schedules`` (``master/state/schedule_book.py``).
"""

from __future__ import annotations

from typing import Any

from master.state.item import DELAYED, LEASED
from master.state.job_book import DEPENDENCY_DEAD, HELD_UNTIL
from master.state.records import (
    AddSchedule,
    CancelItems,
    CommitItems,
    DropSchedule,
    ForgetResults,
    ProgressItems,
    RearmItems,
)


def hold_for(s: Any, rec: CommitItems) -> None:
    """The new items of ``rec`` wait for its dependencies: those unfinished are waited for,
    those done count no more, and one that failed fails them at once."""
    jobs, items = s.jobs, s.items
    pending: set[int] = set()
    failed: int | None = None
    for parent in rec.depends_on:
        if parent in items and parent not in jobs.result_jobs:
            if parent in s.origins:
                failed = parent
            else:
                pending.add(parent)
        elif parent in jobs.recent_cancels or (parent in jobs.results
                                               and jobs.results[parent].kind) or \
                (parent not in jobs.results and parent not in s.recent_acks):
            failed = parent  # dead, cancelled, or gone unfinished (deleted meanwhile)
    for k, item_id in enumerate(rec.ids):
        item = items.get(item_id)
        if item is None or item_id in jobs.waiting or item.enqueued_at != rec.at:
            continue  # not made by this record
        if failed is not None:
            fail_dependent(s, item_id, rec.on_dependency_failure, failed)
        elif pending:
            q = s.queues[item.queue]
            s._leave(q, item)
            s._place(q, items[item_id], HELD_UNTIL)
            jobs.wait(item_id, pending, rec.not_befores[k], rec.on_dependency_failure)


def settle_dependencies(s: Any) -> None:
    """The jobs whose dependencies ended during the record just applied: placed in line
    (all done), or failed, in turn down their chains (a loop: chains may be long; and
    after the record's own loop, so nothing it walks changes under it)."""
    while s._ended:
        parent, done = s._ended.pop(0)
        if done:
            dependency_done(s, parent)
        else:
            dependency_failed(s, parent)


def dependency_done(s: Any, parent: int) -> None:
    """``parent`` is done: the jobs that waited only for it take their places in line."""
    for child, not_before in s.jobs.parent_done(parent):
        item = s.items.get(child)
        if item is not None and item.status == DELAYED:
            q = s.queues[item.queue]
            s._leave(q, item)
            s._place(q, item, not_before)


def dependency_failed(s: Any, parent: int) -> None:
    """``parent`` ended dead, cancelled or deleted: the jobs waiting on it fail, and so in
    turn do the jobs waiting on them (a loop, not a recursion: a chain may be long)."""
    work = [(child, on_failure, parent) for child, on_failure
            in s.jobs.parent_failed(parent)]
    while work:
        child, on_failure, cause = work.pop()
        work += [(grandchild, again, child) for grandchild, again
                 in s.jobs.parent_failed(child)]
        fail_dependent(s, child, on_failure, cause)


def fail_dependent(s: Any, child: int, on_failure: int, parent: int) -> None:
    """One job waiting on ``parent`` fails: moved dead, or cancelled (the jobs waiting on
    it are the caller's)."""
    item = s.items.get(child)
    if item is None:
        return
    if on_failure == DEPENDENCY_DEAD and child not in s.origins:
        q = s.queues[item.queue]
        s._leave(q, item)
        q.unindex(item)
        s.origins[child] = item.queue
        s.errors[child] = f"job {parent}, a dependency, ended dead or cancelled"
        dead = s.queue(q.config.dead_letter_queue(q.name))
        s._place(dead, item, 0.0, queue=dead.name)
    else:
        s.forget(item)
        s.jobs.cancelled(child)


def apply_cancel(s: Any, rec: CancelItems) -> None:
    for item_id in rec.ids:
        item = s.items.get(item_id)
        if item is None:
            continue
        if item.status == LEASED:
            s.jobs.cancels.add(item_id)
        else:
            s.forget(item)
            s.jobs.cancelled(item_id)


def apply_progress(s: Any, rec: ProgressItems) -> None:
    columns = zip(rec.ids, rec.fractions, rec.notes, rec.states, strict=True)
    for item_id, fraction, note, saved in columns:
        item = s.items.get(item_id)
        if item is not None and item.status == LEASED:
            s.jobs.record_progress(item_id, fraction, note, saved)


def apply_forget_results(s: Any, rec: ForgetResults) -> None:
    for item_id in rec.ids:
        item = s.items.get(item_id)
        if item is not None:
            s.forget(item)


def apply_add_schedule(s: Any, rec: AddSchedule) -> None:
    item = s.items.get(rec.item)
    if item is None or item.status == LEASED:
        return  # the handler checked it: a replay meets the same
    replaced = s.schedules.add(rec)
    if replaced is not None and replaced in s.items \
            and s.items[replaced].status != LEASED:
        s.forget(s.items[replaced])  # (a running one finishes as a plain job)
    q = s.queues[item.queue]
    s._leave(q, item)
    s._place(q, item, rec.next_at)


def apply_drop_schedule(s: Any, rec: DropSchedule) -> None:
    item_id = s.schedules.drop(rec.name)
    item = s.items.get(item_id) if item_id is not None else None
    if item is not None and item.status != LEASED:
        s.forget(item)


def apply_rearm(s: Any, rec: RearmItems) -> None:
    """Schedules' items wait for their next ticks, with no attempts counted."""
    for item_id, not_before in zip(rec.ids, rec.not_befores, strict=True):
        sched = s.schedules.of_item(item_id)
        item = s.items.get(item_id)
        if sched is None or item is None:
            continue
        held = s.held.get(item_id)
        if held is not None:  # a retried ack of this run is answered done
            s.recent_acks[item_id] = held[0]
        q = s.queues[item.queue]
        s._leave(q, item)
        if rec.error:
            s.errors[item_id] = rec.error
        elif rec.ran:
            s.errors.pop(item_id, None)
        s.jobs.drop(item_id)  # the next run starts afresh
        s.lapsed.pop(item_id, None)
        s._place(q, item, not_before, attempts=0)
        s.schedules.rearm(sched, not_before, rec.ran)
