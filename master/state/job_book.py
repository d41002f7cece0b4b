"""What the master keeps about jobs beyond their items: results, cancellations, progress.

Part of the state machine (``State`` owns one ``JobBook`` and changes it only while applying
records), so a replay or a standby holds the same book. Kept here:

- **Results.** A job's result is an item of its own in ``<queue>.results`` (payload on the
  data nodes, never here), made by the worker before it acks the job; the book links each job
  to its latest result item, counts the results its runs stored (``runs``: 2 means it ran
  twice) and remembers how it ended (``RESULT_*``). A result item's delay is its time to live:
  when it comes due the master forgets it (``ForgetResults``).
- **Cancellations.** A leased job cancelled is marked until it ends; a job cancelled while
  waiting is forgotten at once and remembered among the last ``RECENT_CANCELS``.
- **Progress.** A leased job's last fraction, note and state; kept when the job is given back,
  so its next attempt gets the state back; dropped with the job.
- **Dependencies.** A job enqueued with ``depends_on`` waits (delayed until ``HELD_UNTIL``)
  while any of those jobs is unfinished; when the last is done it is placed in line (at its
  own delay, if it had one). When one ends dead, cancelled or deleted, the waiting job is
  cancelled, or moved to its dead-letter queue if it was enqueued so
  (``DEPENDENCY_DEAD``), and so in turn are the jobs waiting on it. A job can only depend on
  jobs that exist before it, so dependencies form no cycle.

Costs: a waiting job about 300 bytes, plus about 100 per (job, unfinished dependency) pair
(``MAX_EDGES`` pairs in all: 200 MB; the jobs of one enqueue share one set of dependencies);
a result link about 200 bytes (the result item's record is an item's, about 300);
progress the note and state plus about 200 bytes, states at most ``MAX_STATE_BYTES`` each
(``blizzard/wire/limits.py``) and ``MAX_PROGRESS_BYTES`` in all; a recent cancel about 100
bytes.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, NamedTuple

RECENT_CANCELS = 100_000  # jobs cancelled while waiting, remembered as cancelled
MAX_RESULTS = 1_000_000  # result links the master keeps, at most
MAX_PROGRESS_BYTES = 64 * 1024 * 1024  # all jobs' progress states together
MAX_WAITING = 1_000_000  # jobs waiting for their dependencies, at most
MAX_EDGES = 2_000_000  # (waiting job, unfinished dependency) pairs, at most
HELD_UNTIL = 1e11  # a waiting job's delay: until its dependencies are done
DEPENDENCY_CANCEL, DEPENDENCY_DEAD = 0, 1  # what a failed dependency does to a waiting job
RESULT_DONE = 0  # a result's kind: the job finished (protocol.RESULT_DONE)


class JobResult(NamedTuple):
    """A job's latest result: its item (in ``<queue>.results``), how the job ended, how many
    results its runs stored, and whether a cancel came while it ran."""

    item: int
    kind: int
    runs: int
    cancel_requested: bool


class Waiting(NamedTuple):
    """A job waiting for its dependencies: those unfinished, its own delay (0: none), and
    what a failed dependency does to it (``DEPENDENCY_*``)."""

    on: set[int]
    not_before: float
    on_failure: int


class Progress(NamedTuple):
    fraction: float
    note: str
    state: bytes


class JobBook:
    """Results, cancellations and progress by job id (see the module docstring)."""

    def __init__(self) -> None:
        self.results: dict[int, JobResult] = {}
        self.result_jobs: dict[int, int] = {}  # result item id -> its job
        self.cancels: set[int] = set()  # leased jobs with a cancel requested
        self.recent_cancels: OrderedDict[int, None] = OrderedDict()
        self.progress: dict[int, Progress] = {}
        self.progress_bytes = 0
        self.waiting: dict[int, Waiting] = {}  # job -> what it waits for
        self.dependents: dict[int, set[int]] = {}  # unfinished job -> jobs waiting on it
        self.edges = 0  # (waiting job, dependency) pairs: the dependents' entries
        # soft: jobs someone waits for (master/jobs/status.py), and those of them that ended since
        # it last looked (noted by ``State`` as it applies records; no durable state)
        self.watched: set[int] = set()
        self.touched: list[int] = []

    def touch(self, job: int) -> None:
        """``job`` may have become final: tell its waiters, if any."""
        if job in self.watched:
            self.touched.append(job)

    def wait(self, job: int, on: set[int], not_before: float, on_failure: int) -> None:
        """``job`` waits for ``on`` (a set the jobs of one enqueue share: all wait for the
        same, and a dependency done is done for all)."""
        self.waiting[job] = Waiting(on, not_before, on_failure)
        for parent in on:
            self.dependents.setdefault(parent, set()).add(job)
        self.edges += len(on)

    def unwait(self, job: int) -> None:
        """``job`` waits no more (it is gone): its dependencies forget it."""
        entry = self.waiting.pop(job, None)
        if entry is not None:
            for parent in entry.on:
                children = self.dependents.get(parent)
                if children is not None and job in children:
                    children.discard(job)
                    self.edges -= 1
                    if not children:
                        del self.dependents[parent]

    def transfer(self, old: int, new: int) -> None:
        """Job ``new`` replaced ``old`` (coalescing: the same work, later): the jobs waiting
        on ``old`` wait on ``new`` instead."""
        children = self.dependents.pop(old, None)
        if not children:
            return
        for child in children:
            on = self.waiting[child].on
            on.discard(old)
            on.add(new)
        self.dependents.setdefault(new, set()).update(children)

    def parent_done(self, parent: int) -> list[tuple[int, float]]:
        """``parent`` is done: the jobs that wait for nothing more now, each with its delay."""
        freed = []
        children = self.dependents.pop(parent, ())
        self.edges -= len(children)
        for child in sorted(children):
            entry = self.waiting[child]
            entry.on.discard(parent)  # (shared by its siblings: done for them too)
            if not entry.on:
                del self.waiting[child]
                freed.append((child, entry.not_before))
        return freed

    def parent_failed(self, parent: int) -> list[tuple[int, int]]:
        """``parent`` ended dead, cancelled or deleted: the jobs waiting on it, each with what
        that does to it (they wait no more for anything)."""
        failed = []
        children = self.dependents.pop(parent, ())
        self.edges -= len(children)
        for child in sorted(children):
            on_failure = self.waiting[child].on_failure
            self.unwait(child)
            failed.append((child, on_failure))
        return failed

    def link(self, job: int, item: int, kind: int) -> int | None:
        """``item`` is ``job``'s result now; the result item it replaces, if any."""
        old = self.results.get(job)
        runs = 1
        if old is not None:
            self.result_jobs.pop(old.item, None)
            runs = old.runs + 1
        self.results[job] = JobResult(item, kind, runs, job in self.cancels)
        self.result_jobs[item] = job
        return old.item if old is not None else None

    def unlink(self, item: int) -> None:
        """A result item is gone: its job's link goes with it."""
        job = self.result_jobs.pop(item, None)
        if job is not None and self.results.get(job, JobResult(0, 0, 0, False)).item == item:
            del self.results[job]

    def cancelled(self, job: int) -> None:
        """A job ended cancelled without a result: remembered among the recent ones."""
        self.cancels.discard(job)
        self.recent_cancels[job] = None
        self.recent_cancels.move_to_end(job)
        while len(self.recent_cancels) > RECENT_CANCELS:
            self.recent_cancels.popitem(last=False)

    def record_progress(self, job: int, fraction: float, note: str, state: bytes) -> None:
        old = self.progress.get(job)
        if old is not None:
            self.progress_bytes -= len(old.state)
        if not state and old is not None:
            state = old.state  # progress without a state keeps the last one
        self.progress[job] = Progress(fraction, note, state)
        self.progress_bytes += len(state)

    def drop(self, job: int) -> None:
        """The job is gone (acked, deleted, cancelled): its mark and progress go."""
        self.cancels.discard(job)
        old = self.progress.pop(job, None)
        if old is not None:
            self.progress_bytes -= len(old.state)

    def state_of(self, job: int) -> bytes:
        hit = self.progress.get(job)
        return hit.state if hit is not None else b""

    # -- checkpoints -------------------------------------------------------------------------

    def export(self) -> dict[str, Any]:
        return {"results": [[job, *r] for job, r in self.results.items()],
                "cancels": sorted(self.cancels),
                "recent_cancels": list(self.recent_cancels),
                "progress": [[job, *pr] for job, pr in self.progress.items()],
                "waiting": [[job, sorted(w.on), w.not_before, w.on_failure]
                            for job, w in self.waiting.items()]}

    @classmethod
    def restore(cls, data: dict[str, Any] | None) -> JobBook:
        book = cls()
        if not data:  # a checkpoint older than jobs
            return book
        for job, item, kind, runs, cancel_requested in data["results"]:
            book.results[job] = JobResult(item, kind, runs, cancel_requested)
            book.result_jobs[item] = job
        book.cancels = set(data["cancels"])
        book.recent_cancels = OrderedDict.fromkeys(data["recent_cancels"])
        for job, fraction, note, state in data["progress"]:
            book.record_progress(job, fraction, note, state)
        shared: dict[tuple[int, ...], set[int]] = {}  # one set per distinct dependencies
        for job, on, not_before, on_failure in data.get("waiting", ()):
            book.wait(job, shared.setdefault(tuple(on), set(on)), not_before, on_failure)
        return book

    def snapshot(self) -> tuple[Any, ...]:
        return (sorted(self.results.items()), sorted(self.cancels), list(self.recent_cancels),
                sorted(self.progress.items()),
                sorted((job, sorted(w.on), w.not_before, w.on_failure)
                       for job, w in self.waiting.items()),
                sorted((job, sorted(c)) for job, c in self.dependents.items()))
