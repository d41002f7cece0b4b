"""Jobs as their producers see them: status, waiting for the end, results, cancel.

A job is an item (a task call); what the master keeps of it beyond the item is the state's
``JobBook`` (``master/state/job_book.py``). Served here:

- ``Jobs``: each job's status, attempts, last error, progress, and a grant to read its result
  from the data nodes. With ``wait_s`` the answer waits (parked, like a long poll) until every
  job named is final. A waiter is looked at again only when one of its jobs ended (the state
  notes the watched jobs a record finished, ``JobBook.touched``), or its time is up. Bounded:
  ``MAX_WAITERS`` in all, ``MAX_WAITERS_PER_PEER`` a connection, ``MAX_WAIT_IDS`` jobs each;
  dropped with their connection.
- ``Cancel``: a waiting job is forgotten at once (its blob dropped), a leased one marked; the
  mark rides on the reply to its worker's next extension (``Leases.extend``).
- Progress rides on extensions and is taken in by ``master/consume/progress.py``; here it
  is read back.
- Results running out: a result item's delay is its time to live; a timer forgets those due
  (``ForgetResults``), at most ``EXPIRE_BATCH`` a pass.

Status words (``protocol.JOB_STATES``): queued, delayed (a delay of its own), running,
failed (its last run failed; it waits for a retry), done, dead (in its dead-letter queue, or
its last run failed and it is gone), cancelled, unknown (never made, or finished and
forgotten: results are kept for their time to live, plain acks for the last 100,000).
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from blizzard.wire import protocol as p
from blizzard.wire.codec import as_ids
from blizzard.wire.errors import TooManyItems
from blizzard.wire.limits import MAX_JOBS_WAIT_S, MAX_WAIT_IDS
from blizzard.wire.queue_settings import RESULTS_SUFFIX
from master.consume.leases import Leases
from master.nodes.blob_deletes import Deletes
from master.rules import arguments
from master.state.item import DELAYED, LEASED
from master.state.machine import State
from master.state.records import CancelItems, ForgetResults

log = logging.getLogger(__name__)

MAX_WAITERS = 10_000  # Jobs requests waiting at once
MAX_WAITERS_PER_PEER = 256  # of one connection
EXPIRE_BATCH = 10_000  # results forgotten per pass, at most
EXPIRE_EVERY_S = 1.0  # how often results' times to live are looked at


@dataclass(slots=True, eq=False)
class JobWaiter:
    peer: bytes
    rid: int
    ids: list[int]
    until: float  # monotonic
    fd: int  # its connection's descriptor (-1: unknown): dropped with it
    pending: set[int]  # its jobs not final yet: answered when none is left
    done: bool = False


class JobDesk:
    """Handlers of ``Jobs`` and ``Cancel``; results' time to live."""

    def __init__(self, state: State, log_record: Callable[[Any], None], leases: Leases,
                 deletes: Deletes, *,
                 connection_of: Callable[[bytes], tuple[str, int]] = lambda peer: ("", -1)
                 ) -> None:
        self.state = state
        self.log = log_record
        self.leases = leases
        self.deletes = deletes
        self.waiters: list[tuple[float, int, JobWaiter]] = []  # by deadline: a heap
        self.by_job: dict[int, list[JobWaiter]] = {}
        self.by_peer: dict[bytes, int] = {}
        self.count = 0
        self._seq = 0
        # a connection's descriptor (the server's router), for dropping its waiters with it
        self.connection_of = connection_of
        self.expire_at = 0.0  # monotonic: when results' times to live are looked at next

    # -- status ------------------------------------------------------------------------------

    def jobs(self, msg: p.Jobs, now: float, mono: float, peer: bytes,
             rid: int) -> p.JobStates | None:
        arguments.batch(len(msg.ids), "ids")
        arguments.seconds(msg.wait_s, "wait_s", low=0, high=MAX_JOBS_WAIT_S)
        ids = list(dict.fromkeys(msg.ids))
        pending = {i for i in ids if self.status(i, now) not in p.FINAL_STATES} \
            if msg.wait_s else set()
        if pending:
            self._park(JobWaiter(peer, rid, ids, mono + msg.wait_s,
                                 self.connection_of(peer)[1], pending))
            return None
        return self.describe(ids, now)

    def _park(self, w: JobWaiter) -> None:
        if len(w.ids) > MAX_WAIT_IDS:
            raise TooManyItems(f"a request that waits names at most {MAX_WAIT_IDS} jobs, not "
                               f"{len(w.ids)} (wait for more in parts)")
        if self.count >= MAX_WAITERS:
            raise TooManyItems(f"{MAX_WAITERS} requests wait for jobs already; retry later")
        if self.by_peer.get(w.peer, 0) >= MAX_WAITERS_PER_PEER:
            raise TooManyItems(f"this connection has {MAX_WAITERS_PER_PEER} requests waiting "
                               "for jobs, at most")
        self.count += 1
        self.by_peer[w.peer] = self.by_peer.get(w.peer, 0) + 1
        self._seq += 1
        heapq.heappush(self.waiters, (w.until, self._seq, w))
        book = self.state.jobs
        for job in w.pending:
            self.by_job.setdefault(job, []).append(w)
            book.watched.add(job)

    def _unpark(self, w: JobWaiter) -> None:
        w.done = True
        self.count -= 1
        left = self.by_peer[w.peer] - 1
        if left:
            self.by_peer[w.peer] = left
        else:
            del self.by_peer[w.peer]
        book = self.state.jobs
        for job in w.pending:
            others = self.by_job.get(job)
            if others is not None:
                others.remove(w)
                if not others:
                    del self.by_job[job]
                    book.watched.discard(job)

    def in_progress(self, msg: p.InProgress, now: float, *_: Any) -> p.JobStates:
        arguments.batch(msg.limit, "jobs")
        state = self.state
        ids = [job for job in state.jobs.progress if job in state.held][:msg.limit]
        return self.describe(ids, now)

    def status(self, job: int, now: float) -> str:
        state = self.state
        item = state.items.get(job)
        book = state.jobs
        if item is not None and job not in book.result_jobs:
            if job in state.origins:
                return "dead"
            if item.status == LEASED:
                return "running"
            if job in book.waiting:
                return "waiting"
            if job in state.errors:
                return "failed"
            if item.status == DELAYED and state.delays[job] > now:
                return "delayed"
            return "queued"
        result = book.results.get(job)
        if result is not None:
            return ("done", "dead", "cancelled")[result.kind]
        if job in book.recent_cancels:
            return "cancelled"
        if job in state.recent_acks:
            return "done"
        return "unknown"

    def describe(self, ids: list[int], now: float) -> p.JobStates:
        state, book = self.state, self.state.jobs
        states, queues, attempts, runs, errors, cancels, fractions, notes = \
            [], [], [], [], [], [], [], []
        kept: dict[str, list[tuple[int, int]]] = {}  # results queue -> (result item, job)
        cut = arguments.error_cut(len(ids))
        for job in ids:
            states.append(self.status(job, now))
            item = state.items.get(job)
            result = book.results.get(job)
            queues.append(item.queue if item is not None and job not in book.result_jobs
                          else "")
            attempts.append(item.attempts if item is not None else 0)
            errors.append(state.errors.get(job, "")[:cut])
            runs.append(result.runs if result is not None else 0)
            cancels.append(job in book.cancels or (result is not None
                                                   and result.cancel_requested))
            progress = book.progress.get(job)
            fractions.append(progress.fraction if progress is not None else -1.0)
            notes.append(progress.note if progress is not None else "")
            if result is not None and result.item in state.items:
                home = state.items[result.item].queue
                kept.setdefault(home, []).append((result.item, job))
        pairs = [pair for group in kept.values() for pair in group]
        described = self.leases.describe("", [r for r, _ in pairs], [], now)
        by_item = state.schedules.by_item
        schedules = [by_item.get(job, "") for job in ids] if by_item else []
        return p.JobStates(as_ids(ids), states, queues, attempts, runs, errors, cancels,
                           fractions, notes, described, as_ids([j for _, j in pairs]),
                           schedules if any(schedules) else [])

    def serve_waiters(self, now: float, mono: float) -> list[tuple[bytes, int, Any]]:
        """Answers for the waiters whose time is up, and for those whose jobs are all final,
        looked at only when one of their jobs ended (``JobBook.touched``)."""
        book = self.state.jobs
        touched, book.touched = book.touched, []
        if not self.count:
            return []
        replies = []
        for job in dict.fromkeys(touched):
            if self.status(job, now) not in p.FINAL_STATES:
                continue
            for w in list(self.by_job.get(job, ())):  # each waiter: one job fewer to wait for
                w.pending.discard(job)
                self.by_job[job].remove(w)
                if not w.pending:
                    self._unpark(w)
                    replies.append((w.peer, w.rid, self.describe(w.ids, now)))
            if not self.by_job.get(job):
                self.by_job.pop(job, None)
                self.state.jobs.watched.discard(job)
        while self.waiters and (self.waiters[0][2].done or self.waiters[0][0] <= mono):
            _, _, w = heapq.heappop(self.waiters)
            if not w.done:
                self._unpark(w)
                replies.append((w.peer, w.rid, self.describe(w.ids, now)))
        return replies

    def drop_departed(self, fds: set[int]) -> int:
        """Forget the waits of connections that ended: nobody is there to answer."""
        if not fds or not self.count:
            return 0
        gone = [w for _, _, w in self.waiters if not w.done and w.fd in fds]
        for w in gone:
            self._unpark(w)
        return len(gone)

    def next_wake(self) -> float | None:
        while self.waiters and self.waiters[0][2].done:
            heapq.heappop(self.waiters)
        return self.waiters[0][0] if self.waiters else None

    # -- cancel ------------------------------------------------------------------------------

    def cancel(self, msg: p.Cancel, now: float, *_: Any) -> p.Acked:
        arguments.batch(len(msg.ids), "ids")
        state = self.state
        book = state.jobs
        ids, lost, why = [], [], []
        for job in dict.fromkeys(msg.ids):
            item = state.items.get(job)
            if job in state.schedules.by_item:  # a schedule's: remove the schedule instead
                lost.append(job)
                why.append(p.NOT_CANCELLED_SCHEDULE)
            elif item is None or job in book.result_jobs \
                    or item.queue.endswith(RESULTS_SUFFIX):
                lost.append(job)
                why.append(p.NOT_CANCELLED_FINAL if self.status(job, now) != "unknown"
                           else p.NOT_CANCELLED_UNKNOWN)
            elif job in book.cancels or job in state.origins:
                lost.append(job)
                why.append(p.NOT_CANCELLED_FINAL)
            else:
                ids.append(job)
        if ids:
            waiting = [(i, state.items[i].nodes) for i in ids
                       if state.items[i].status != LEASED]
            self.log(CancelItems(ids=ids))
            for item_id, nodes in waiting:
                self.deletes.drop_blobs(item_id, nodes)
        return p.Acked(done=len(ids), lost=as_ids(lost), why=why)

    # -- results running out -----------------------------------------------------------------

    def expire_results(self, now: float, mono: float) -> None:
        """Forget the result items whose time to live has ended (looked at once a second:
        a result lives up to a second past its time)."""
        if mono < self.expire_at:
            return
        self.expire_at = mono + EXPIRE_EVERY_S
        state = self.state
        due: list[int] = []
        for name, q in state.queues.items():
            if name.endswith(RESULTS_SUFFIX) and (q.n_delayed or q.n_ready):
                due += state.head(name, EXPIRE_BATCH - len(due), now)  # due ones are ready
                if len(due) >= EXPIRE_BATCH:
                    break
        if due:
            nodes = [state.items[i].nodes for i in due]
            self.log(ForgetResults(ids=due))
            for item_id, holders in zip(due, nodes, strict=True):
                self.deletes.drop_blobs(item_id, holders)
