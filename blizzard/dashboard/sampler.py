"""The status page's data: the master sampled every few seconds into a bounded history, and
the JSON document the page draws from it (``/api/state``).

The dashboard is a client of the master like any other. One ``Status`` request per sample
brings everything the page shows (data nodes, every queue's counters and totals), so the
figures of one sample are of one moment. A background thread alone owns its ``Client`` (a
client is not thread-safe); the HTTP threads read a copy of the history under a lock.

What a request costs is bounded whatever the options: the history holds at most
``MAX_SAMPLES`` samples, the charts get at most ``MAX_POINTS`` points a series (samples are
merged into buckets), and the document is made once per new sample (``StateCache``), not
once per request.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from blizzard.wire import protocol as p
from blizzard.wire.errors import BlizzardError, InvalidArgument
from blizzard.wire.queue_settings import DEAD_SUFFIX

log = logging.getLogger(__name__)

INTERVAL_S = 2.0  # between samples
HISTORY_S = 600.0  # how far back the charts reach
RATE_WINDOW_S = 60.0  # the table's rates are averaged over this long
MAX_QUEUES_SHOWN = 50  # bounds the page and its JSON; the rest are counted, not shown
MAX_SAMPLES = 3600  # the history's length in samples: history_s / interval_s at most
MAX_POINTS = 160  # a chart's points: one per pixel of the page's 160-pixel-wide charts
MAX_JOBS_SHOWN = 50  # schedules, and jobs in progress, on the page


@dataclass(frozen=True)
class Sample:
    """What the master said at one moment, or why it said nothing."""

    at: float  # wall-clock time, shown on the page
    mono: float  # monotonic time, for rates
    status: p.ClusterStatus | None  # None: the master did not answer
    error: str = ""  # why it did not
    since_s: float = 0.0  # seconds since the previous answered sample (0: none before it)
    # queue -> (items enqueued, items acked) since that sample
    increases: dict[str, tuple[int, int]] = field(default_factory=dict)
    queues: dict[str, p.QueueStats] = field(default_factory=dict)
    jobs: JobsView | None = None  # schedules and jobs in progress (None: not asked)


@dataclass(frozen=True)
class JobsView:
    """The schedules and the running jobs that reported progress, at one moment."""

    schedules: list[p.ScheduleInfo]
    running: p.JobStates | None


def increase(before: int, after: int) -> int:
    """How much a total grew; a total that shrank restarted from zero (the master restarted)."""
    return after - before if after >= before else after


def check_history(interval_s: float, history_s: float) -> None:
    """``InvalidArgument`` unless a history of ``history_s`` sampled every ``interval_s``
    fits in ``MAX_SAMPLES`` samples (each holds every queue's figures)."""
    if interval_s <= 0 or history_s <= 0:
        raise InvalidArgument(f"the interval and the history must be positive, not "
                              f"{interval_s:g} s and {history_s:g} s")
    if history_s / interval_s > MAX_SAMPLES:
        raise InvalidArgument(
            f"a history of {history_s:g} s sampled every {interval_s:g} s is "
            f"{history_s / interval_s:.0f} samples, more than {MAX_SAMPLES}: sample every "
            f"{math.ceil(history_s / MAX_SAMPLES * 10) / 10:g} s or more, or keep at most "
            f"{math.floor(interval_s * MAX_SAMPLES):g} s")


class History:
    """The last ``history_s`` of samples, oldest first; each answered one knows what changed
    since the answered one before it. ``InvalidArgument`` if that is over ``MAX_SAMPLES``."""

    def __init__(self, interval_s: float = INTERVAL_S, history_s: float = HISTORY_S) -> None:
        check_history(interval_s, history_s)
        self.interval_s = interval_s
        self.history_s = history_s
        self._samples: collections.deque[Sample] = collections.deque(
            maxlen=max(2, round(history_s / interval_s)))
        self._last_answered: Sample | None = None
        self._lock = threading.Lock()
        self.added = 0  # samples added so far: a document made at this count is still current

    def add(self, at: float, mono: float, status: p.ClusterStatus | None,
            error: str = "", jobs: JobsView | None = None) -> Sample:
        """Record a sample (from one thread: the sampler's)."""
        queues = {q.queue: q for q in status.queues} if status is not None else {}
        since_s, increases = 0.0, {}
        before = self._last_answered
        if status is not None and before is not None:
            since_s = mono - before.mono
            for name, q in queues.items():
                old = before.queues.get(name)
                increases[name] = (increase(old.enqueued_total if old else 0, q.enqueued_total),
                                   increase(old.acked_total if old else 0, q.acked_total))
        sample = Sample(at, mono, status, error, since_s, increases, queues, jobs)
        with self._lock:
            self._samples.append(sample)
            self.added += 1
            if status is not None:
                self._last_answered = sample
        return sample

    def samples(self) -> list[Sample]:
        with self._lock:
            return list(self._samples)


def take_sample(status: Callable[[], p.ClusterStatus]) -> tuple[p.ClusterStatus | None, str]:
    """Ask the master once: its status, or None and a one-line reason.

    Any failure becomes a failed sample that the page shows: the sampler must outlive it.
    """
    try:
        return status(), ""
    except BlizzardError as exc:
        return None, f"{exc.message} ({type(exc).__name__})"
    except Exception as exc:  # not the master's answer: a fault of ours, logged in full
        log.exception("sampling the master failed")
        return None, f"{exc} ({type(exc).__name__})"


def take_jobs(client: Any) -> JobsView | None:
    """The schedules and jobs in progress, or None if the master does not tell them (an
    older one) or did not answer: the page shows what it has."""
    call = getattr(getattr(client, "master", None), "call", None)
    if call is None:
        return None
    try:
        schedules = call(p.ListSchedules([])).schedules[:MAX_JOBS_SHOWN]
        return JobsView(schedules, call(p.InProgress(MAX_JOBS_SHOWN)))
    except BlizzardError:
        return None


class Sampler:
    """A daemon thread adding a sample to ``history`` every ``interval_s`` until ``stop``."""

    def __init__(self, connect: Callable[[], Any], history: History) -> None:
        """``connect`` makes the thread's client (anything with ``status()`` and ``close()``)."""
        self.connect = connect
        self.history = history
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dashboard-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        client = self.connect()
        last_error = ""
        try:
            while not self._stopping.is_set():
                started = time.monotonic()
                status, error = take_sample(client.status)
                jobs = take_jobs(client) if status is not None else None
                if error and error != last_error:  # once per change, not every sample
                    log.warning("the master does not answer: %s", error)
                elif last_error and not error:
                    log.warning("the master answers again")
                last_error = error
                self.history.add(time.time(), time.monotonic(), status, error, jobs)
                self._stopping.wait(max(0.0, self.history.interval_s -
                                        (time.monotonic() - started)))
        finally:
            client.close()


# -- the document the page draws ------------------------------------------------------------

def _cluster_doc(st: p.ClusterStatus) -> dict[str, Any]:
    alive = sum(1 for n in st.nodes if n.alive)
    return {"secure": st.secure, "replication": st.replication, "safe_mode": st.safe_mode,
            "under_replicated": st.under_replicated, "nodes_alive": alive,
            "nodes_dead": len(st.nodes) - alive,
            "nodes": [{"node_id": n.node_id, "addr": n.addr, "alive": n.alive,
                       "heartbeat_age_s": round(n.heartbeat_age_s, 1), "items": n.items,
                       "bytes_used": n.bytes_used, "free_bytes": n.free_bytes}
                      for n in st.nodes]}


def _rates(samples: list[Sample], name: str) -> tuple[float | None, float | None]:
    """Items enqueued and acked per second for queue ``name`` over ``samples``; None, None
    when none of them measured it."""
    enqueued = acked = 0
    seconds = 0.0
    for s in samples:
        moved = s.increases.get(name)
        if moved is not None and s.since_s > 0:
            enqueued, acked, seconds = enqueued + moved[0], acked + moved[1], seconds + s.since_s
    if seconds <= 0:
        return None, None
    return round(enqueued / seconds, 2), round(acked / seconds, 2)


def _recent(samples: list[Sample], window_s: float) -> list[Sample]:
    """The samples of the last ``window_s``, found from the newest back."""
    if not samples:
        return []
    since = samples[-1].mono - window_s
    first = len(samples)
    while first > 0 and samples[first - 1].mono >= since:
        first -= 1
    return samples[first:]


def dead_letter_queue(q: p.QueueStats) -> str:
    """Where ``q``'s dead items are: its ``dead_letter`` setting, else its name + ".dead"."""
    # with_settings adds the settings' fields (queue_settings.py), which mypy cannot see
    return q.settings.dead_letter or q.queue + DEAD_SUFFIX  # type: ignore[attr-defined]


def _queue_doc(q: p.QueueStats, recent: list[Sample]) -> dict[str, Any]:
    enqueue_per_s, ack_per_s = _rates(recent, q.queue)
    return {"queue": q.queue, "ready": q.ready, "delayed": q.delayed, "leased": q.leased,
            "pending": q.pending, "dead": q.dead, "dead_letter": dead_letter_queue(q),
            "oldest_age_s": round(q.oldest_age_s, 1),
            "enqueued_total": q.enqueued_total, "acked_total": q.acked_total,
            # nothing measured yet (one answer so far): nothing moved, as far as is known
            "enqueue_per_s": enqueue_per_s or 0.0, "ack_per_s": ack_per_s or 0.0}


def buckets(samples: list[Sample], max_points: int = MAX_POINTS) -> list[list[Sample]]:
    """``samples`` in runs of equal length, at most ``max_points`` runs, the newest run ending
    with the newest sample (only the oldest run may be shorter)."""
    size = max(1, math.ceil(len(samples) / max_points))
    return [samples[max(0, end - size):end] for end in range(len(samples), 0, -size)][::-1]


def _series(runs: list[list[Sample]], name: str) -> dict[str, list[Any]]:
    """One queue's chart lines, a point per run of samples: the run's last depths and its
    rates (None where the master did not answer in the whole run)."""
    out: dict[str, list[Any]] = {"ready": [], "leased": [], "delayed": [],
                                 "enqueue_per_s": [], "ack_per_s": []}
    for run in runs:
        q = next((s.queues[name] for s in reversed(run) if name in s.queues), None)
        for key in ("ready", "leased", "delayed"):
            out[key].append(getattr(q, key) if q is not None else None)
        enqueue_per_s, ack_per_s = _rates(run, name)
        out["enqueue_per_s"].append(enqueue_per_s)
        out["ack_per_s"].append(ack_per_s)
    return out


def _jobs_doc(view: JobsView | None) -> dict[str, Any]:
    if view is None:
        return {"schedules": [], "progress": []}
    schedules = [{"name": s.spec.name, "queue": s.spec.queue, "job": s.job,
                  "when": s.spec.cron or f"every {s.spec.every_s:g} s",
                  "timezone": s.spec.timezone, "next_at": s.next_at, "runs": s.runs,
                  "state": s.state, "error": s.error}
                 for s in view.schedules]
    r = view.running
    progress = [] if r is None else [
        {"id": r.ids[k], "queue": r.queues[k], "progress": r.progress[k], "note": r.notes[k],
         "attempts": r.attempts[k], "cancel_requested": r.cancel_requested[k]}
        for k in range(len(r.ids))]
    return {"schedules": schedules, "progress": progress}


def state_doc(history: History, master: str, now: float) -> dict[str, Any]:
    """``/api/state``: the latest answered sample in full, the charts' series, and whether
    the master answers now (if not: since when, and why)."""
    samples = history.samples()
    latest = samples[-1] if samples else None
    answered = next((s for s in reversed(samples) if s.status is not None), None)
    queues = sorted(answered.queues.values(), key=lambda q: q.queue) if answered else []
    shown = queues[:MAX_QUEUES_SHOWN]
    recent, runs = _recent(samples, RATE_WINDOW_S), buckets(samples)
    return {
        "master": master, "now": now, "interval_s": history.interval_s,
        "history_s": history.history_s,
        "reachable": latest is not None and latest.status is not None,
        "error": latest.error if latest is not None else "",
        "sampled_at": latest.at if latest is not None else None,
        "answered_at": answered.at if answered is not None else None,
        "cluster": _cluster_doc(answered.status) if answered and answered.status else None,
        "queues": [_queue_doc(q, recent) for q in shown],
        "queues_hidden": len(queues) - len(shown) + (answered.status.queues_more
                                                      if answered and answered.status else 0),
        "history": {"t": [round(run[-1].at, 1) for run in runs],
                    "queues": {q.queue: _series(runs, q.queue) for q in shown}},
        **_jobs_doc(answered.jobs if answered is not None else None),
    }


class StateCache:
    """``/api/state`` as JSON, made once per new sample however many requests ask for it; a
    request adds only the time it was asked (``now``)."""

    def __init__(self, history: History, master: str) -> None:
        self.history, self.master = history, master
        self._lock = threading.Lock()
        self._made_at = -1  # ``history.added`` when ``_body`` was made
        self._body = ""

    def body(self, now: float) -> bytes:
        with self._lock:
            added = self.history.added
            if added != self._made_at:
                doc = state_doc(self.history, self.master, now)
                del doc["now"]
                self._body, self._made_at = json.dumps(doc), added
            body = self._body
        return ('{"now": ' + json.dumps(now) + ", " + body[1:]).encode()
