"""Jobs by id, as a producer sees them: status, result, cancel; and results as a worker
stores them (master/jobs/status.py serves them).

A job is any item; a job run by ``blizzard worker`` (an ``@task`` call) also has a result,
which the worker stores before it acks the job: an item of ``<queue>.results`` whose payload
lives on the data nodes (replicated like any payload, never through the master) for its time
to live. ``JobStatus.result`` is that payload, read with the grant the master's answer
carries; what it means is the worker's (``blizzard/worker/results.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from blizzard.client.enqueue_options import EnqueueOptions
from blizzard.client.message import leased_items
from blizzard.wire import protocol as p
from blizzard.wire.codec import as_ids
from blizzard.wire.errors import InvalidArgument
from blizzard.wire.limits import MAX_JOBS_WAIT_S, MAX_RESULT_TTL_S, MAX_WAIT_IDS
from blizzard.wire.queue_settings import results_queue


@dataclass(frozen=True)
class JobStatus:
    """One job as the master knows it (``Client.jobs``).

    ``state``: queued, delayed, running, failed (its last run failed; it waits for a
    retry), done, dead, cancelled or unknown. ``runs``: results its runs stored (more than
    one: it ran more than once). ``progress``: the fraction its task last reported (None:
    none), with ``note``. ``result``: its result's payload (None: none kept, or not read).
    """

    id: int
    state: str
    queue: str
    attempts: int
    runs: int
    error: str
    cancel_requested: bool
    progress: float | None
    note: str
    result: bytes | None
    schedule: str = ""  # a schedule's job: the schedule's name (each run is for a tick)

    @property
    def final(self) -> bool:
        """Done, dead, cancelled or unknown: it changes no more (but for a redrive)."""
        return self.state in p.FINAL_STATES


def job_statuses(client: Any, ids: Sequence[int], wait_s: float = 0.0,
                 read: bool = True) -> list[JobStatus]:
    """``Client.jobs``: each job's status, in the order asked; ``wait_s``: until all are
    final, up to that long (one request parked on the master per minute of it)."""
    ids = as_ids(list(ids))
    if not ids:
        return []
    if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or wait_s < 0:
        raise InvalidArgument(f"wait_s must be a non-negative number of seconds, got {wait_s!r}")
    until = time.monotonic() + wait_s
    by_id: dict[int, JobStatus] = {}
    step = MAX_WAIT_IDS if wait_s > 0 else p.MAX_BATCH
    for start in range(0, len(ids), step):
        part = list(dict.fromkeys(ids[start:start + step]))
        while True:
            left = max(0.0, until - time.monotonic())
            reply: p.JobStates = client.master.call(p.Jobs(part, min(left, MAX_JOBS_WAIT_S)),
                                                    extra_s=min(left, MAX_JOBS_WAIT_S))
            if left <= MAX_JOBS_WAIT_S or all(s in p.FINAL_STATES for s in reply.states):
                break
        by_id.update((s.id, s) for s in _statuses(client, reply, read))
    return [by_id[i] for i in ids]


def _statuses(client: Any, reply: p.JobStates, read: bool) -> list[JobStatus]:
    payloads: dict[int, bytes] = {}
    if read and reply.results.ids:
        by_item, _ = client.fetch(leased_items(reply.results))
        pairs = zip(reply.results.ids, reply.result_of, strict=True)
        payloads = {job: by_item[item] for item, job in pairs if item in by_item}
    schedules = reply.schedules or [""] * len(reply.ids)
    return [JobStatus(job, reply.states[k], reply.queues[k], reply.attempts[k], reply.runs[k],
                      reply.errors[k], reply.cancel_requested[k],
                      reply.progress[k] if reply.progress[k] >= 0 else None, reply.notes[k],
                      payloads.get(job), schedules[k])
            for k, job in enumerate(reply.ids)]


NOT_CANCELLED = {p.NOT_CANCELLED_FINAL: "it had ended (done, dead or cancelled)",
                 p.NOT_CANCELLED_UNKNOWN: "no such job (never made, or forgotten)",
                 p.NOT_CANCELLED_SCHEDULE: "a schedule's job: remove the schedule instead "
                                           "(blizzard schedule remove NAME)"}


def cancel_explained(client: Any, ids: Iterable[int]) -> dict[int, str]:
    """Each id, in order, and "" if it was cancelled (or asked to stop, if running), else
    why not."""
    ids = as_ids(list(dict.fromkeys(ids)))
    out: dict[int, str] = {}
    for start in range(0, len(ids), p.MAX_BATCH):
        part = ids[start:start + p.MAX_BATCH]
        reply: p.Acked = client.master.call(p.Cancel(part))
        why = list(reply.why) + [p.NOT_CANCELLED_FINAL] * (len(reply.lost) - len(reply.why))
        refused = dict(zip(reply.lost, why, strict=True))
        out.update((i, NOT_CANCELLED.get(refused[i], "refused") if i in refused else "")
                   for i in part)
    return out


def cancel_jobs(client: Any, ids: Iterable[int]) -> list[int]:
    """``Client.cancel``: the ids it cancelled (or asked to stop, if running)."""
    return [i for i, why in cancel_explained(client, ids).items() if not why]


def store_results(client: Any, queue: str, jobs: Sequence[Any], blobs: Sequence[bytes],
                  kind: int, ttl_s: float) -> list[int]:
    """``Client.store_results``: blobs as the results of ``jobs`` (leased messages of
    ``queue``: only a job's lease holder stores its result), kept ``ttl_s``; each job's
    result replaces the one an earlier run stored. The result items' ids, once durable (a
    job's ack should wait for that: "done" then never shows without its result)."""
    if len(jobs) != len(blobs):
        raise InvalidArgument(f"{len(jobs)} jobs but {len(blobs)} results")
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)) \
            or not 0 < ttl_s <= MAX_RESULT_TTL_S:
        raise InvalidArgument(f"a result's time to live must be in (0, {MAX_RESULT_TTL_S:g}] "
                              f"seconds, got {ttl_s!r}")
    if not jobs:
        return []
    opts = EnqueueOptions(delay_s=float(ttl_s), result_kind=kind)
    made: list[int] = client.pipeline.enqueue(results_queue(queue), blobs, opts,
                                              result_of=as_ids([m.id for m in jobs]),
                                              result_leases=[m.lease for m in jobs])
    return made
