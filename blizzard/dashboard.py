"""The status page's data: the master sampled every few seconds into a bounded history, and
the JSON document the page draws from it (``/api/state``).

The dashboard is a client of the master like any other. One ``Status`` request per sample
brings everything the page shows (data nodes, every queue's counters and totals), so the
figures of one sample are of one moment. A background thread alone owns its ``Client`` (a
client is not thread-safe); the HTTP threads read a copy of the history under a lock.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from blizzard import protocol as p
from blizzard.errors import BlizzardError

log = logging.getLogger(__name__)

INTERVAL_S = 2.0  # between samples
HISTORY_S = 600.0  # how far back the charts reach
RATE_WINDOW_S = 60.0  # the table's rates are averaged over this long
MAX_QUEUES_SHOWN = 50  # bounds the page and its JSON; the rest are counted, not shown


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


def increase(before: int, after: int) -> int:
    """How much a total grew; a total that shrank restarted from zero (the master restarted)."""
    return after - before if after >= before else after


class History:
    """The last ``history_s`` of samples, oldest first; each answered one knows what changed
    since the answered one before it."""

    def __init__(self, interval_s: float = INTERVAL_S, history_s: float = HISTORY_S) -> None:
        self.interval_s = interval_s
        self.history_s = history_s
        self._samples: collections.deque[Sample] = collections.deque(
            maxlen=max(2, round(history_s / interval_s)))
        self._last_answered: Sample | None = None
        self._lock = threading.Lock()

    def add(self, at: float, mono: float, status: p.ClusterStatus | None,
            error: str = "") -> Sample:
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
        sample = Sample(at, mono, status, error, since_s, increases, queues)
        with self._lock:
            self._samples.append(sample)
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


class Sampler:
    """A daemon thread adding a sample to ``history`` every ``interval_s`` until ``stop``."""

    def __init__(self, connect: Callable[[], Any], history: History) -> None:
        """``connect`` makes the thread's client (anything with ``status()`` and ``close()``)."""
        self.connect = connect
        self.history = history
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dashboard-sampler", daemon=True)

    def start(self) -> "Sampler":
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
                if error and error != last_error:  # once per change, not every sample
                    log.warning("the master does not answer: %s", error)
                elif last_error and not error:
                    log.warning("the master answers again")
                last_error = error
                self.history.add(time.time(), time.monotonic(), status, error)
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


def _rates(samples: list[Sample], name: str, window_s: float) -> tuple[float, float]:
    """Items enqueued and acked per second for queue ``name`` over the last ``window_s``."""
    enqueued = acked = 0
    seconds = 0.0
    last = samples[-1].mono if samples else 0.0
    for s in samples:
        if s.status is not None and s.since_s > 0 and s.mono >= last - window_s:
            e, a = s.increases.get(name, (0, 0))
            enqueued, acked, seconds = enqueued + e, acked + a, seconds + s.since_s
    if seconds <= 0:
        return 0.0, 0.0
    return round(enqueued / seconds, 2), round(acked / seconds, 2)


def _queue_doc(q: p.QueueStats, samples: list[Sample]) -> dict[str, Any]:
    enqueue_per_s, ack_per_s = _rates(samples, q.queue, RATE_WINDOW_S)
    return {"queue": q.queue, "ready": q.ready, "delayed": q.delayed, "leased": q.leased,
            "pending": q.pending, "dead": q.dead, "oldest_age_s": round(q.oldest_age_s, 1),
            "enqueued_total": q.enqueued_total, "acked_total": q.acked_total,
            "enqueue_per_s": enqueue_per_s, "ack_per_s": ack_per_s}


def _series(samples: list[Sample], name: str) -> dict[str, list[Any]]:
    """One queue's chart lines, a value per sample (None where the master did not answer)."""
    out: dict[str, list[Any]] = {"ready": [], "leased": [], "delayed": [],
                                 "enqueue_per_s": [], "ack_per_s": []}
    for s in samples:
        q = s.queues.get(name)
        for key in ("ready", "leased", "delayed"):
            out[key].append(getattr(q, key) if q is not None else None)
        moved = s.increases.get(name)
        rated = moved is not None and s.since_s > 0
        out["enqueue_per_s"].append(round(moved[0] / s.since_s, 2) if rated else None)
        out["ack_per_s"].append(round(moved[1] / s.since_s, 2) if rated else None)
    return out


def state_doc(history: History, master: str, now: float) -> dict[str, Any]:
    """``/api/state``: the latest answered sample in full, the charts' series, and whether
    the master answers now (if not: since when, and why)."""
    samples = history.samples()
    latest = samples[-1] if samples else None
    answered = next((s for s in reversed(samples) if s.status is not None), None)
    queues = sorted(answered.queues.values(), key=lambda q: q.queue) if answered else []
    shown = queues[:MAX_QUEUES_SHOWN]
    return {
        "master": master, "now": now, "interval_s": history.interval_s,
        "history_s": history.history_s,
        "reachable": latest is not None and latest.status is not None,
        "error": latest.error if latest is not None else "",
        "sampled_at": latest.at if latest is not None else None,
        "answered_at": answered.at if answered is not None else None,
        "cluster": _cluster_doc(answered.status) if answered and answered.status else None,
        "queues": [_queue_doc(q, samples) for q in shown],
        "queues_hidden": len(queues) - len(shown),
        "history": {"t": [round(s.at, 1) for s in samples],
                    "queues": {q.queue: _series(samples, q.queue) for q in shown}},
    }
