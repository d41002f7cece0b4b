"""The worker's loop (``blizzard worker``): lease jobs in batches, run them, settle them.

One process, one ``Client``, ``concurrency`` runner threads (``runner.py`` says why threads).
Only this loop talks to the cluster; per round trip to the master it moves many jobs:

- Leases come in batches: enough for every idle thread plus a prefetch sized by the recent
  job length (``Prefetch``: about ``BUFFER_S`` of work, at most ``MAX_PREFETCH`` jobs and
  about ``MAX_PREFETCH_BYTES`` of payloads by the recent item size), so a no-op task is
  leased a thousand at a time and a slow one a job per free thread.
- The acks of finished jobs ride on the next lease (``Lease.ack_ids``). Acks that would wait
  longer than ``ACK_HOLD_S`` for one go out alone, unanswered (``Message.ack()``'s way), and
  so does the ack of a job whose lease may be lost: a lost ack on a lease makes the master's
  answer void and the jobs that lease took go back, each with an attempt counted.
- A job that raised is nacked with its error: the queue's back-off says when it comes back,
  its ``max_attempts`` when it moves to the dead-letter queue instead. A job whose task
  name is unknown here (another worker may know it) is nacked without delay, so it reaches
  the dead-letter queue after ``max_attempts`` quick deliveries (a queue with
  ``max_attempts`` 0 keeps it, retried every ``POISON_RETRY_S``). A job whose payload is not
  a task call can succeed on no worker: it is buried (moved to the dead-letter queue) at once.
- The leases of jobs held, running or waiting, are kept alive by the client's lease keeper
  (``blizzard/client/lease_keeper.py``, the dispatcher's too): extended when a third of them
  is left; an extension the cluster did not answer is tried again soon, and until one
  succeeds those leases are in doubt and keep their old deadlines.
- A lost lease or an unreachable cluster while settling is logged, never fatal: a job not
  settled comes back when its lease ends (delivery is at least once).

``stop()`` (SIGTERM) ends leasing; the jobs already leased are run (a prefetched one too:
giving it back would count a delivery attempt against it, and the prefetch is about
``BUFFER_S`` of work), their acks kept for one last ``ack_many`` that waits (up to the
client's ``timeout_s``) until they are durable, and ``run`` returns. ``burst``: ``run``
returns once every queue was found empty and no job is left.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

from blizzard.client.api import BlizzardClient
from blizzard.client.http_delivery import bury
from blizzard.client.lease_keeper import Held, LeaseKeeper, extension
from blizzard.client.message import Message
from blizzard.host.log_limit import Throttled
from blizzard.wire import protocol as p
from blizzard.wire.errors import NOT_HELD, ClusterError, InvalidArgument, TooManyItems
from blizzard.wire.queue_settings import DEAD_SUFFIX
from blizzard.worker.context import JobContext
from blizzard.worker.results import encode_result
from blizzard.worker.runner import Outcome, Runner
from blizzard.worker.task import Task, declare_schedule, ensure_queue, settings_of

log = logging.getLogger(__name__)
slots_full = Throttled(log)  # one line per 10 s while the slots stay full

BUFFER_S = 0.1  # prefetched work, by the recent job length, beyond the jobs running
MAX_PREFETCH = 2000  # jobs held beyond the running ones, at most
MAX_PREFETCH_BYTES = 64 << 20  # payloads held beyond the running jobs, by the recent item size
JOB_S_WEIGHT = 0.1  # of a job's run time (or an item's size) in the moving average
ACK_HOLD_S = 0.2  # the longest an ack waits for a lease to ride on
IDLE_POLL_S = 1.0  # a long poll on an empty queue; a recheck while only running jobs
POISON_RETRY_S = 60.0  # an undoable job's retry delay in a queue that never dead-letters


class Prefetch:
    """How many jobs to hold beyond those running: ``buffer_s`` of work for the threads, by
    the recent job length (no prefetch before the first job is done, nor for long jobs), at
    most ``cap`` jobs and about ``cap_bytes`` of payloads, by the recent item size (big
    payloads must not fill the worker's memory)."""

    def __init__(self, concurrency: int, buffer_s: float = BUFFER_S, cap: int = MAX_PREFETCH,
                 cap_bytes: int = MAX_PREFETCH_BYTES) -> None:
        self.concurrency, self.buffer_s = concurrency, buffer_s
        self.cap, self.cap_bytes = cap, cap_bytes
        self.job_s: float | None = None  # a moving average of the jobs' run times
        self.item_bytes: float | None = None  # a moving average of the payloads' sizes

    def record(self, seconds: float) -> None:
        self.job_s = _moved(self.job_s, seconds)

    def record_sizes(self, sizes: Iterable[int]) -> None:
        for size in sizes:
            self.item_bytes = _moved(self.item_bytes, size)

    def target(self) -> int:
        if self.job_s is None:
            return 0
        by_time = int(self.concurrency * self.buffer_s / max(self.job_s, 1e-9))
        by_bytes = int(self.cap_bytes / max(self.item_bytes or 1.0, 1.0))
        return min(self.cap, by_time, by_bytes)


def _moved(average: float | None, value: float) -> float:
    """A moving average with ``value`` taken in (the first value starts it)."""
    return value if average is None else average + (value - average) * JOB_S_WEIGHT


@dataclass(frozen=True)
class WorkerConfig:
    """What to serve and how; ``lease_s`` None: each queue's own lease length."""

    queues: tuple[str, ...]
    concurrency: int = 8
    burst: bool = False
    lease_s: float | None = None


class Worker:
    """Runs ``tasks`` on jobs from ``config.queues`` until stopped (or, in burst mode, idle)."""

    def __init__(self, client: BlizzardClient, tasks: dict[str, Task],
                 config: WorkerConfig) -> None:
        if not config.queues or config.concurrency < 1:
            raise InvalidArgument("a worker needs at least one queue and one thread")
        self.client, self.tasks, self.config = client, tasks, config
        self.prefetch = Prefetch(config.concurrency)
        # leased jobs not yet settled, running or waiting for a thread, by (id, lease): a
        # job may come twice; ``acks``: done, their acks not sent yet
        self.held: dict[tuple[int, int], Held] = {}
        self.acks: list[Held] = []
        self.acks_since = 0.0  # monotonic: when the oldest ack in ``acks`` was ready
        self.lease_s: dict[str, float] = {}
        self.max_attempts: dict[str, int] = {}
        self.dead_letter: dict[str, str] = {}  # each queue's dead-letter queue
        self.result_ttl_s: dict[str, float] = {}  # each queue's, for tasks that name none
        self.contexts: dict[tuple[int, int], JobContext] = {}  # held jobs' sides for tasks
        self.keeper = LeaseKeeper()  # extends the leases of ``held`` and ``acks``
        self.empty_at: float | None = None  # the last lease round found every queue empty
        self.settled_since_empty = False
        self.stopping = False
        self.succeeded = self.failed = 0

    def stop(self) -> None:
        """Stop leasing; ``run`` returns when the jobs held are done (safe in a signal handler)."""
        self.stopping = True

    def unsettled(self) -> list[Held]:
        """The jobs leased and not settled yet: running, waiting for a thread, or done with
        their acks not sent (a signal handler may call it: it only reads)."""
        return [*self.held.values(), *self.acks]

    def run(self) -> None:
        self._prepare()
        runner = Runner(self.tasks, self.config.concurrency)
        started = time.monotonic()
        try:
            while not self._finished():
                self._settle(runner.outcomes(self._wait_s(), self._wake_at()))
                if self._wants_lease():
                    runner.submit(self._lease_round())
                self._extend_due()
                self._send_progress()
                self._flush_acks()
        finally:
            try:
                self._ack_last()
            finally:
                runner.close(5.0 if not self.held else 0.0)
        log.info("worker done: %s succeeded, %d failed in %.3f s",
                 counted(self.succeeded, "job"), self.failed, time.monotonic() - started)

    def _prepare(self) -> None:
        """Create the queues with their tasks' settings if new; learn their lease lengths."""
        for queue in self.config.queues:
            settings = settings_of(self.tasks.values(), queue)
            if settings:
                ensure_queue(self.client, queue, settings)
            current = self.client.queue_config(queue)
            self.lease_s[queue] = self.config.lease_s or current["lease_s"]
            self.max_attempts[queue] = current["max_attempts"]
            self.dead_letter[queue] = current.get("dead_letter") or queue + DEAD_SUFFIX
            self.result_ttl_s[queue] = current.get("result_ttl_s", 86400.0)  # older masters
        for t in self.tasks.values():  # every worker declares them: the master keeps one each
            if t.schedule is not None and t.queue in self.config.queues:
                declare_schedule(self.client, t)
                log.info("schedule %s: %s on %s", t.name, t.schedule.cron or
                         f"every {t.schedule.every_s:g} s", t.queue)

    def _finished(self) -> bool:
        if self.held:
            return False
        return self.stopping or (self.config.burst and self.empty_at is not None
                                 and not self.settled_since_empty)

    # -- leasing -----------------------------------------------------------------------------

    def _room(self) -> int:
        return self.config.concurrency + self.prefetch.target() - len(self.held)

    def _wants_lease(self) -> bool:
        if self.stopping or self._room() <= 0:
            return False
        if self.empty_at is not None and self.held and not self.settled_since_empty \
                and time.monotonic() - self.empty_at < IDLE_POLL_S:
            return False  # the queues were empty a moment ago and nothing has changed
        return len(self.held) < self.config.concurrency + max(1, self.prefetch.target() // 2)

    def _wait_s(self) -> float:
        """How long to wait for outcomes before the loop looks at leases again."""
        if self._wants_lease():
            return 0.0
        now = time.monotonic()
        until = min(self.keeper.next_at, now + IDLE_POLL_S)
        if self.acks and not self.stopping:  # stopping, the acks wait for the last flush
            until = min(until, self.acks_since + ACK_HOLD_S)
        return max(0.0, until - now)

    def _wake_at(self) -> int:
        """How many outcomes are worth waking for: as many as make room for the next lease
        (all held jobs when stopping)."""
        if self.stopping:
            return max(1, len(self.held))
        threshold = self.config.concurrency + max(1, self.prefetch.target() // 2)
        return max(1, len(self.held) - threshold + 1)

    def _lease_round(self) -> list[JobContext]:
        """Lease from the queues in order until there is no room; long-poll the first queue
        when all are empty and no job is held (not in burst mode)."""
        riders = self._take_riders()
        got: list[JobContext] = []
        failed = False
        for queue in self.config.queues:  # each lease adds its jobs to ``held``, so to room
            msgs = self._lease(queue, self._room(), 0.0, riders)
            riders = []
            failed |= msgs is None
            got += msgs or []
            if self._room() <= 0:
                break
        if not got and not failed and not self.held and not self.config.burst:
            got = self._lease(self.config.queues[0], self._room(), IDLE_POLL_S, []) or []
        # a failed lease proves no queue empty: burst mode goes on
        self.empty_at = None if got or failed else time.monotonic()
        self.settled_since_empty = False
        return got

    def _lease(self, queue: str, n: int, wait_s: float,
               riders: list[Held]) -> list[JobContext] | None:
        """Jobs leased from ``queue`` with ``riders`` acked; None if the lease failed."""
        sent = time.monotonic()
        try:
            msgs = self.client.dequeue_many(queue, n, lease_s=self.lease_s[queue],
                                            wait_s=wait_s, ack=[h.msg for h in riders])
        except NOT_HELD as exc:
            log.warning("%s; the jobs leased with those acks went back to %s", exc.message, queue)
            return None
        except TooManyItems as exc:
            if wait_s <= 0:
                raise
            # the master's long-poll slots are taken (by this key's other connections, say):
            # poll instead of parking, at the pace a long poll would have set
            slots_full("long polls", "cannot long-poll %s, polling instead: %s", queue,
                       exc.message)
            polled = self._lease(queue, n, 0.0, riders)
            if polled == [] and not self.stopping:
                time.sleep(min(wait_s, IDLE_POLL_S))
            return polled
        except ClusterError as exc:
            log.warning("leasing from %s failed, trying again: %s (%s)", queue, exc.message,
                        type(exc).__name__)
            for held in riders:  # sent again, alone: the call may have outlived their leases
                held.doubtful = True
            self.acks[:0] = riders  # an ack already applied counts once
            return None
        lease_s = self.lease_s[queue]
        self.prefetch.record_sizes(len(msg.data) for msg in msgs)
        got = []
        for msg in msgs:
            held = self.held[msg.id, msg.lease] = Held(msg, lease_s, sent + lease_s)
            self.keeper.hold(held)
            ctx = self.contexts[msg.id, msg.lease] = JobContext(msg)
            got.append(ctx)
        return got

    # -- settling ----------------------------------------------------------------------------

    def _settle(self, outcomes: list[Outcome]) -> None:
        if not outcomes:
            return
        now = time.monotonic()
        for outcome in outcomes:
            self.prefetch.record(outcome.seconds)
            self.contexts.pop((outcome.msg.id, outcome.msg.lease), None)
        self.settled_since_empty = True
        self._store_results(outcomes)  # before the acks: "done" never shows without its result
        # by error, delay and doubt: a job whose lease may be lost is given back on its own
        nacks: dict[tuple[str, float | None, bool], list[Message]] = {}
        burials: dict[tuple[str, bool], list[Message]] = {}
        for outcome in outcomes:
            held = self.held.pop((outcome.msg.id, outcome.msg.lease))
            if outcome.cancelled:  # given back: the master ends a cancelled job so
                log.info("job %d of %s stopped: it was cancelled", outcome.msg.id,
                         outcome.msg.queue)
                nacks.setdefault(("cancelled", 0.0, held.doubtful), []).append(outcome.msg)
                continue
            if not outcome.error:
                if not self.acks:
                    self.acks_since = now
                self.acks.append(held)
                self.succeeded += 1
                continue
            self.failed += 1
            self._log_failure(outcome)
            msg = outcome.msg
            if outcome.bury:
                burials.setdefault((outcome.error, held.doubtful), []).append(msg)
            else:
                key = (outcome.error, self._retry_delay(outcome), held.doubtful)
                nacks.setdefault(key, []).append(msg)
        for (error, delay_s, _), msgs in nacks.items():
            self._guarded("give back", msgs,
                          partial(self.client.nack_many, delay_s=delay_s, error=error))
        for (error, _), msgs in burials.items():  # not buried now: buried when back
            self._guarded("move to the dead-letter queue", msgs,
                          partial(bury, self.client, error=error))

    def _store_results(self, outcomes: list[Outcome]) -> None:
        """Store the results of the jobs that ended: a success's return value, a cancelled
        job's None, a last failure's error (one call per queue, time to live and kind). A
        result that cannot be stored is logged; the job is settled all the same."""
        groups: dict[tuple[str, float, int], tuple[list[Message], list[bytes]]] = {}
        for o in outcomes:
            if o.task is None:
                continue
            queue = o.msg.queue
            ttl = o.task.result_ttl_s if o.task.result_ttl_s is not None \
                else self.result_ttl_s.get(queue, 0.0)
            if ttl <= 0:
                continue
            attempt = o.msg.attempts + 1
            if o.cancelled:
                kind, blob = p.RESULT_CANCELLED, encode_result(None, attempt, o.seconds)
            elif not o.error:
                kind, blob = p.RESULT_DONE, o.result
            elif self._last_attempt(o):
                kind, blob = p.RESULT_FAILED, encode_result(o.error, attempt, o.seconds)
            else:
                continue
            jobs, blobs = groups.setdefault((queue, ttl, kind), ([], []))
            jobs.append(o.msg)
            blobs.append(blob)
        for (queue, ttl, kind), (jobs, blobs) in groups.items():
            try:
                self.client.store_results(queue, jobs, blobs, kind=kind, ttl_s=ttl)
            except ClusterError as exc:
                log.warning("could not store the results of jobs %s of %s: %s (%s); they are "
                            "settled without them", brief_ids(jobs), queue, exc.message,
                            type(exc).__name__)

    def _last_attempt(self, outcome: Outcome) -> bool:
        """Whether giving this failed job back moves it to its dead-letter queue."""
        limit = 1 if outcome.bury else self.max_attempts.get(outcome.msg.queue, 0)
        return bool(limit) and outcome.msg.attempts + 1 >= limit

    def _log_failure(self, outcome: Outcome) -> None:
        """A failed job's line, saying when giving it back moves it to the dead-letter queue
        (its last attempt, or a payload no worker can run)."""
        msg = outcome.msg
        limit = 1 if outcome.bury else self.max_attempts.get(msg.queue, 0)
        attempt = msg.attempts + 1
        of = f" of {limit}" if limit and not outcome.bury else ""
        if limit and attempt >= limit:
            log.warning("job %d of %s failed (attempt %d%s), moving it to the dead-letter queue "
                        "%s: %s", msg.id, msg.queue, attempt, of,
                        self.dead_letter.get(msg.queue, msg.queue + DEAD_SUFFIX), outcome.error)
        else:
            log.warning("job %d of %s failed (attempt %d%s): %s", msg.id, msg.queue, attempt, of,
                        outcome.error)

    def _guarded(self, doing: str, msgs: list[Message],
                 send: Callable[[list[Message]], None]) -> bool:
        """``send(msgs)``; False if a lease was lost or the cluster did not answer, which is
        logged: a job's settling never ends the worker (a job not settled comes back when
        its lease ends, and runs again)."""
        if not msgs:
            return True
        try:
            send(msgs)
            return True
        except NOT_HELD as exc:
            log.warning("could not %s %s: their leases were lost (delivered again, or "
                        "soon): %s", doing, counted(len(msgs), "job"), exc.message)
        except ClusterError as exc:
            log.warning("could not %s jobs %s: %s (%s); they come back when their leases end",
                        doing, brief_ids(msgs), exc.message, type(exc).__name__)
        return False

    def _retry_delay(self, outcome: Outcome) -> float | None:
        """None: the queue's back-off; a poison job: at once, unless it could never die."""
        if not outcome.poison:
            return None
        return 0.0 if self.max_attempts.get(outcome.msg.queue) else POISON_RETRY_S

    def _take_riders(self) -> list[Held]:
        """The acks to carry on the next lease; those whose lease may be lost go out alone
        first (one lost ack would void the lease it rides on)."""
        now = time.monotonic()
        riders = [h for h in self.acks if h.sure(now)]
        alone = [h.msg for h in self.acks if not h.sure(now)]
        self.acks = []
        self._guarded("ack", alone, self.client.leases.ack_unawaited)
        return riders

    def _flush_acks(self) -> None:
        """Send the acks that waited ``ACK_HOLD_S`` for a lease, unanswered; none while
        stopping: the last flush sends those and waits for them."""
        if self.acks and not self.stopping \
                and time.monotonic() - self.acks_since >= ACK_HOLD_S:
            msgs, self.acks = [h.msg for h in self.acks], []
            self._guarded("ack", msgs, self.client.leases.ack_unawaited)

    def _ack_last(self) -> None:
        """Ack the jobs left and wait until those acks, and the ones sent unanswered before,
        are durable (up to the client's ``timeout_s``); log the ones not confirmed."""
        sure = [h.msg for h in self.acks if not h.doubtful]
        doubtful = [h.msg for h in self.acks if h.doubtful]
        self.acks = []
        self._guarded("ack", sure, self.client.ack_many)
        self._guarded("ack", doubtful, self.client.ack_many)
        try:
            self.client.leases.flush(self.client.timeout_s)
        except (ClusterError, TimeoutError) as exc:
            log.warning("the acks sent unanswered may not be durable (those jobs may run "
                        "again): %s", exc)

    def _extend_due(self) -> None:
        """Extend every lease held (running, waiting, or done and not acked) that is due."""
        self.keeper.extend_due([*self.held.values(), *self.acks], self._extend)

    def _send_progress(self) -> None:
        """Extend now the leases of running jobs with progress to tell (at most once per
        ``PROGRESS_EVERY_S`` each): progress rides on extensions."""
        now = time.monotonic()
        due: dict[float, list[Held]] = {}
        for key, ctx in self.contexts.items():
            held = self.held.get(key)
            if held is not None and not held.doubtful and ctx.due(now):
                due.setdefault(held.lease_s, []).append(held)
        for lease_s, group in due.items():
            self.keeper.take(group, lease_s, now, extension(self._extend, group, lease_s))

    def _extend(self, msgs: list[Message], lease_s: float) -> None:
        """Extend ``msgs``' leases, with their jobs' progress; mark the jobs the answer says
        were cancelled (their tasks see it at their next safe point)."""
        now = time.monotonic()
        told: dict[int, tuple[float, str, bytes]] = {}
        taken: list[tuple[JobContext, tuple[float, str, bytes]]] = []
        for msg in msgs:
            ctx = self.contexts.get((msg.id, msg.lease))
            if ctx is not None and (progress := ctx.take_progress(now, force=True)) is not None:
                told[msg.id] = progress
                taken.append((ctx, progress))
        try:
            cancel = self.client.extend_many(msgs, lease_s=lease_s, progress=told or None)
        except BaseException:
            for ctx, progress in taken:  # told again next time, unless a newer one came
                with ctx.lock:
                    ctx.unsent = ctx.unsent or progress
            raise
        if cancel:
            stop = set(cancel)
            for (item_id, _), ctx in self.contexts.items():
                if item_id in stop and not ctx.cancel.is_set():
                    log.info("job %d was cancelled: its task stops at its next safe point",
                             item_id)
                    ctx.cancel.set()


def counted(n: int, noun: str) -> str:
    """``1 job``, ``2 jobs``: a count and its noun, plural unless the count is one."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def brief_ids(msgs: list[Message]) -> str:
    """The ids of ``msgs`` for a log line: the first 20, and how many more."""
    shown = ", ".join(str(m.id) for m in msgs[:20])
    return f"[{shown}{f' and {len(msgs) - 20} more' if len(msgs) > 20 else ''}]"
