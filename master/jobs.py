"""Jobs as their producers see them: status, waiting for the end, results, cancel, progress.

A job is an item (a task call); what the master keeps of it beyond the item is the state's
``JobBook`` (``master/job_book.py``). Served here:

- ``Jobs``: each job's status, attempts, last error, progress, and a grant to read its result
  from the data nodes. With ``wait_s`` the answer waits (parked, like a long poll) until every
  job named is final: the master looks at the waiters again only after a pass that logged a
  record, since only a record makes a job final.
- ``Cancel``: a waiting job is forgotten at once (its blob dropped), a leased one marked; the
  mark rides on the reply to its worker's next extension (``Leases.extend``).
- Progress riding on an extension (``Extend.progress_ids``): logged as ``ProgressItems``
  for the items the extension held; a state over the bounds is refused, the extension not.
- Results running out: a result item's delay is its time to live; a timer forgets those due
  (``ForgetResults``), at most ``EXPIRE_BATCH`` a pass.

Status words (``protocol.JOB_STATES``): queued, delayed (a delay of its own), running,
failed (its last run failed; it waits for a retry), done, dead (in its dead-letter queue, or
its last run failed and it is gone), cancelled, unknown (never made, or finished and
forgotten: results are kept for their time to live, plain acks for the last 100,000).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable

from blizzard.net.log_limit import Throttled
from blizzard.wire import protocol as p
from blizzard.wire.codec import as_ids
from blizzard.wire.errors import InvalidArgument, TooManyItems
from blizzard.wire.queue_settings import RESULTS_SUFFIX
from master import checks
from master.deletes import Deletes
from master.item import DELAYED, LEASED
from master.job_book import MAX_NOTE_CHARS, MAX_PROGRESS_BYTES, MAX_STATE_BYTES
from master.leases import Leases
from master.records import CancelItems, ForgetResults, ProgressItems
from master.state import State

log = logging.getLogger(__name__)
too_much_progress = Throttled(log)

MAX_WAIT_S = 60.0  # the longest a Jobs request waits
MAX_WAITERS = 10_000  # Jobs requests waiting at once
EXPIRE_BATCH = 10_000  # results forgotten per pass, at most
EXPIRE_EVERY_S = 1.0  # how often results' times to live are looked at
ERROR_SHOWN = 2_000  # characters of a job's last error in a reply


@dataclass(slots=True)
class JobWaiter:
    peer: bytes
    rid: int
    ids: list[int]
    until: float  # monotonic


class JobDesk:
    """Handlers of ``Jobs`` and ``Cancel``; progress intake; results' time to live."""

    def __init__(self, state: State, log_record: Callable[[Any], None], leases: Leases,
                 deletes: Deletes, records_appended: Callable[[], int]) -> None:
        self.state = state
        self.log = log_record
        self.leases = leases
        self.deletes = deletes
        self.records_appended = records_appended
        self.waiters: list[JobWaiter] = []
        self.seen_records = -1  # the WAL's count when the waiters were last looked at
        self.expire_at = 0.0  # monotonic: when results' times to live are looked at next
        leases.progress = self.progress

    # -- status ------------------------------------------------------------------------------

    def jobs(self, msg: p.Jobs, now: float, mono: float, peer: bytes,
             rid: int) -> p.JobStates | None:
        checks.batch(len(msg.ids), "ids")
        checks.seconds(msg.wait_s, "wait_s", low=0, high=MAX_WAIT_S)
        ids = list(dict.fromkeys(msg.ids))
        if msg.wait_s and not self.all_final(ids):
            if len(self.waiters) >= MAX_WAITERS:
                raise TooManyItems(f"{MAX_WAITERS} requests wait for jobs already; retry later")
            self.waiters.append(JobWaiter(peer, rid, ids, mono + msg.wait_s))
            return None
        return self.describe(ids, now)

    def in_progress(self, msg: p.InProgress, now: float, *_: Any) -> p.JobStates:
        checks.batch(msg.limit, "jobs")
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

    def all_final(self, ids: list[int]) -> bool:
        return all(self.status(i, 0.0) in p.FINAL_STATES for i in ids)

    def describe(self, ids: list[int], now: float) -> p.JobStates:
        state, book = self.state, self.state.jobs
        states, queues, attempts, runs, errors, cancels, fractions, notes = \
            [], [], [], [], [], [], [], []
        kept: dict[str, list[tuple[int, int]]] = {}  # results queue -> (result item, job)
        for job in ids:
            states.append(self.status(job, now))
            item = state.items.get(job)
            result = book.results.get(job)
            queues.append(item.queue if item is not None and job not in book.result_jobs
                          else "")
            attempts.append(item.attempts if item is not None else 0)
            errors.append(state.errors.get(job, "")[:ERROR_SHOWN])
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
        return p.JobStates(as_ids(ids), states, queues, attempts, runs, errors, cancels,
                           fractions, notes, described, as_ids([j for _, j in pairs]))

    def serve_waiters(self, now: float, mono: float) -> list[tuple[bytes, int, Any]]:
        """Answers for the waiters whose jobs are all final, or whose time is up."""
        if not self.waiters:
            return []
        appended = self.records_appended()
        changed, self.seen_records = appended != self.seen_records, appended
        replies, still = [], []
        for w in self.waiters:
            if mono >= w.until or (changed and self.all_final(w.ids)):
                replies.append((w.peer, w.rid, self.describe(w.ids, now)))
            else:
                still.append(w)
        self.waiters = still
        return replies

    def next_wake(self) -> float | None:
        return min(w.until for w in self.waiters) if self.waiters else None

    # -- cancel ------------------------------------------------------------------------------

    def cancel(self, msg: p.Cancel, now: float, *_: Any) -> p.Acked:
        checks.batch(len(msg.ids), "ids")
        state = self.state
        book = state.jobs
        ids, lost = [], []
        for job in dict.fromkeys(msg.ids):
            item = state.items.get(job)
            if item is None or job in book.result_jobs or job in book.cancels \
                    or job in state.origins or item.queue.endswith(RESULTS_SUFFIX) \
                    or job in state.schedules.by_item:  # a schedule's: remove it instead
                lost.append(job)
            else:
                ids.append(job)
        if ids:
            waiting = [(i, state.items[i].nodes) for i in ids
                       if state.items[i].status != LEASED]
            self.log(CancelItems(ids=ids))
            for item_id, nodes in waiting:
                self.deletes.drop_blobs(item_id, nodes)
        return p.Acked(done=len(ids), lost=as_ids(lost))

    # -- progress ----------------------------------------------------------------------------

    def progress(self, msg: p.Extend, held: list[int]) -> None:
        """Log the progress an extension carries for the items it held; refuse it whole
        (``InvalidArgument``) if malformed, drop a state the master has no room for."""
        n = checks.same_length(progress_ids=msg.progress_ids, fractions=msg.fractions,
                               notes=msg.notes, states=msg.states)
        for fraction, note, saved in zip(msg.fractions, msg.notes, msg.states):
            if not (math.isfinite(fraction) and 0.0 <= fraction <= 1.0):
                raise InvalidArgument(f"progress is a fraction in [0, 1], got {fraction!r}")
            if len(note) > MAX_NOTE_CHARS:
                raise InvalidArgument(f"a progress note has at most {MAX_NOTE_CHARS} "
                                      f"characters, got {len(note)}")
            if len(saved) > MAX_STATE_BYTES:
                raise InvalidArgument(f"a progress state is at most {MAX_STATE_BYTES} bytes "
                                      f"encoded, got {len(saved)}")
        mine = set(held)
        book = self.state.jobs
        room = MAX_PROGRESS_BYTES - book.progress_bytes
        ids, fractions, notes, states = [], [], [], []
        for k in range(n):
            job = msg.progress_ids[k]
            if job not in mine:
                continue
            saved = msg.states[k]
            if len(saved) > room:
                too_much_progress("progress", "progress states fill the master's %d bytes; "
                                  "a state of job %d is dropped", MAX_PROGRESS_BYTES, job)
                saved = b""
            room -= len(saved)
            ids.append(job)
            fractions.append(msg.fractions[k])
            notes.append(msg.notes[k])
            states.append(saved)
        if ids:
            self.log(ProgressItems(ids=ids, fractions=fractions, notes=notes, states=states))

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
            for item_id, holders in zip(due, nodes):
                self.deletes.drop_blobs(item_id, holders)
