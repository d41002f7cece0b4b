"""The bounded workload: producer and consumer threads, each with its own ``Client``.

Every call is recorded in the history before it is made and when it returns. A producer
sends each batch one of two ways, chosen at random: ``enqueue_many`` (the everyday call, with
its own retries; any error leaves the outcome unknown), or ``stage`` then ``commit``: a stage
that raised never reached a commit, so that enqueue definitely failed, while a commit that
raised may have landed, so its outcome is indeterminate.
Consumers verify each payload against its embedded checksum and ack the batch; a consumer
can be told to stall past its lease first (a slow worker).
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from blizzard import Client
from blizzard.wire.errors import NOT_HELD, BlizzardError
from chaos import payload
from chaos.history import FAIL, INFO, OK, History

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class WorkloadConfig:
    """How hard the workload pushes; the defaults suit a 2-core machine."""

    queue: str = "chaos"
    producers: int = 2
    consumers: int = 2
    batch_min: int = 10
    batch_max: int = 50
    rate_per_producer: float = 150.0  # items/s
    max_backlog: int = 5000  # producers wait while this many acknowledged items are unseen
    standing_backlog: int = 2000  # consumers leave this many in the queue until the drain, so
    # faults hit items at rest (replicas to repair, wiped disks to survive), not only in flight
    lease_s: float = 2.0
    wait_s: float = 0.5  # a consumer's long-poll
    timeout_s: float = 10.0  # a client's deadline for master requests (rides out restarts)
    consumer_node_timeout_s: float = 1.0  # reads fail over to the next replica after this


def dead_letter_queue(queue: str) -> str:
    """Where the master moves items past their queue's max_attempts (the default setting)."""
    return f"{queue}.dead"


class Progress:
    """Counts shared by the workers: sequence numbers and the backlog of unseen items."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seqs = itertools.count()
        self.acknowledged = 0
        self.seen: set[int] = set()
        self.draining = threading.Event()

    def take(self, n: int) -> list[int]:
        with self._lock:
            return [next(self._seqs) for _ in range(n)]

    def enqueued(self, n: int) -> None:
        with self._lock:
            self.acknowledged += n

    def dequeued(self, seqs: list[int | None]) -> None:
        with self._lock:
            self.seen.update(s for s in seqs if s is not None)

    @property
    def backlog(self) -> int:
        with self._lock:
            return self.acknowledged - len(self.seen)


class Worker(threading.Thread):
    """A thread with a stop flag, its own client and its own random stream."""

    def __init__(self, name: str, master: str, history: History, config: WorkloadConfig,
                 seed: int, progress: Progress) -> None:
        super().__init__(name=name, daemon=True)
        self.master, self.history, self.config = master, history, config
        self.seed, self.progress = seed, progress
        self.rng = random.Random(f"{seed}/{name}")
        self.stopping = threading.Event()

    def stop(self) -> None:
        self.stopping.set()

    def batch_size(self) -> int:
        return self.rng.randint(self.config.batch_min, self.config.batch_max)


class Producer(Worker):
    """Enqueues batches at a steady rate while the backlog stays bounded."""

    def run(self) -> None:
        with Client(self.master, timeout_s=self.config.timeout_s) as client:
            next_at = time.monotonic()
            while not self.stopping.is_set():
                n = self.batch_size()
                next_at = max(next_at + n / self.config.rate_per_producer, time.monotonic() - 1.0)
                if self.stopping.wait(max(0.0, next_at - time.monotonic())):
                    break
                if self.progress.backlog >= self.config.max_backlog:
                    continue
                self.enqueue(client, self.progress.take(n))

    def enqueue(self, client: Client, seqs: list[int]) -> None:
        blobs = [payload.make(self.seed, s) for s in seqs]
        via = "enqueue_many" if self.rng.random() < 0.5 else "stage"
        self.history.invoke(self.name, "enqueue", {"seqs": seqs, "via": via,
                                                   "digests": [payload.digest(b) for b in blobs]})
        if via == "enqueue_many":
            outcome, value, error = self._enqueue_many(client, seqs, blobs)
        else:
            outcome, value, error = self._stage_and_commit(client, seqs, blobs)
        self.history.record(self.name, outcome, "enqueue", value, error)
        if outcome == OK:
            self.progress.enqueued(len(seqs))
        else:
            self.stopping.wait(0.2)

    def _enqueue_many(self, client: Client, seqs: list[int],
                      blobs: list[bytes]) -> tuple[str, dict[str, Any], str | None]:
        try:
            ids = client.enqueue_many(self.config.queue, blobs)
        except Exception as exc:  # a commit may have landed before the error
            return INFO, {"seqs": seqs}, _error(exc)
        return OK, {"seqs": seqs, "ids": ids}, None

    def _stage_and_commit(self, client: Client, seqs: list[int],
                          blobs: list[bytes]) -> tuple[str, dict[str, Any], str | None]:
        try:
            staged = client.stage(self.config.queue, blobs)
        except Exception as exc:  # nothing was committed, whatever went wrong
            return FAIL, {"seqs": seqs}, _error(exc)
        ids = [i for chunk in staged for i in chunk[0]]
        try:
            client.commit(staged)
        except Exception as exc:  # the commit may have landed before the error
            return INFO, {"seqs": seqs, "ids": ids}, _error(exc)
        return OK, {"seqs": seqs, "ids": ids}, None


class Consumer(Worker):
    """Dequeues batches, checks payloads and acks them; ``stall`` makes it hold one batch.

    With ``dead_letter`` it reads the queue's dead-letter queue instead (at the drain).
    """

    def __init__(self, *args: Any, dead_letter: bool = False, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.dead_letter = dead_letter
        self.queue = dead_letter_queue(self.config.queue) if dead_letter else self.config.queue
        self._stall: tuple[float, threading.Event] | None = None
        self._lock = threading.Lock()

    def stall(self, duration_s: float) -> threading.Event:
        """Hold the next non-empty batch ``duration_s`` before acking; the event marks the end."""
        done = threading.Event()
        with self._lock:
            self._stall = (duration_s, done)
        return done

    def run(self) -> None:
        with Client(self.master, timeout_s=self.config.timeout_s,
                    node_timeout_s=self.config.consumer_node_timeout_s) as client:
            while not self.stopping.is_set():
                if (not self.progress.draining.is_set()
                        and self.progress.backlog < self.config.standing_backlog):
                    self.stopping.wait(0.05)
                    continue
                msgs = self.dequeue(client)
                if msgs:
                    self._maybe_stall()
                    self.ack(client, msgs)

    def dequeue(self, client: Client) -> list[Any]:
        n = self.batch_size()
        self.history.invoke(self.name, "dequeue", {"n": n, "queue": self.queue})
        try:
            msgs = client.dequeue_many(self.queue, n, lease_s=self.config.lease_s,
                                       wait_s=self.config.wait_s)
        except Exception as exc:  # leased items, if any, come back when their lease ends
            self.history.record(self.name, INFO, "dequeue", None, _error(exc))
            self.stopping.wait(0.1)
            return []
        items = []
        for m in msgs:
            got = payload.parse(m.data)
            items.append([m.id, got.seq, got.digest, got.intact, m.attempts])
        self.history.record(self.name, OK, "dequeue",
                            {"items": items, "dead_letter": self.dead_letter})
        self.progress.dequeued([item[1] for item in items])
        return msgs

    def _maybe_stall(self) -> None:
        with self._lock:
            stall, self._stall = self._stall, None
        if stall is not None:
            duration_s, done = stall
            self.history.invoke(self.name, "stall", {"duration_s": duration_s})
            time.sleep(duration_s)  # not cut short by stop: the point is to miss the lease
            self.history.record(self.name, OK, "stall", {"duration_s": duration_s})
            done.set()

    def ack(self, client: Client, msgs: list[Any]) -> None:
        ids = [m.id for m in msgs]
        self.history.invoke(self.name, "ack", {"ids": ids})
        try:
            client.ack_many(msgs)
        except NOT_HELD as exc:
            # The leases still held were acked; find out which were lost, one by one
            # (acking an item that is already gone counts as done, so this is safe).
            acked, lost, unknown = [], [], []
            for m in msgs:
                try:
                    client.ack_many([m])
                    acked.append(m.id)
                except NOT_HELD:
                    lost.append(m.id)
                except Exception:  # outcome unknown; the checker counts it as settled
                    unknown.append(m.id)
            self.history.record(self.name, FAIL, "ack",
                                {"acked": acked, "lost": lost, "unknown": unknown}, _error(exc))
        except Exception as exc:  # the ack may have landed
            self.history.record(self.name, INFO, "ack", {"ids": ids}, _error(exc))
        else:
            self.history.record(self.name, OK, "ack", {"ids": ids})


def _error(exc: Exception) -> str:
    if not isinstance(exc, BlizzardError):
        log.warning("unexpected %s in a worker: %s", type(exc).__name__, exc)
    return f"{type(exc).__name__}: {exc}"


DEAD_LETTER_CONSUMER = "consumer-dead"


def worker_names(config: WorkloadConfig) -> list[str]:
    """The name of every worker of a run (each is a thread and a ``process`` in the history)."""
    return [*(f"producer-{i}" for i in range(config.producers)),
            *(f"consumer-{i}" for i in range(config.consumers)), DEAD_LETTER_CONSUMER]


class Workload:
    """The producers and consumers of a run: all of them, or those in ``names`` (a client host
    runs its share, ``chaos.client_host``, with a ``progress`` shared between hosts)."""

    def __init__(self, master: str, history: History, config: WorkloadConfig, seed: int, *,
                 progress: Progress | None = None, names: Collection[str] | None = None) -> None:
        self.config = config
        self.progress = progress or Progress()
        mine = [n for n in worker_names(config) if names is None or n in names]
        self.producers = [Producer(n, master, history, config, seed, self.progress)
                          for n in mine if n.startswith("producer-")]
        self.consumers = [Consumer(n, master, history, config, seed, self.progress)
                          for n in mine if n.startswith("consumer-") and n != DEAD_LETTER_CONSUMER]
        # Started at the drain, to take what was dead-lettered (more than max_attempts leases).
        self.dead_letter_consumer = Consumer(DEAD_LETTER_CONSUMER, master, history, config, seed,
                                             self.progress, dead_letter=True) \
            if DEAD_LETTER_CONSUMER in mine else None

    def start(self) -> None:
        for w in [*self.producers, *self.consumers]:
            w.start()

    def stop_producers(self, timeout_s: float = 60.0) -> None:
        _stop(self.producers, timeout_s)

    def drain(self) -> None:
        """Let the consumers take everything: the standing backlog and the dead letters too."""
        self.progress.draining.set()
        if self.dead_letter_consumer is not None:
            self.dead_letter_consumer.start()

    def stop_consumers(self, timeout_s: float = 60.0) -> None:
        dead = self.dead_letter_consumer
        started = [dead] if dead is not None and dead.ident else []
        _stop([*self.consumers, *started], timeout_s)


def _stop(workers: list[Worker], timeout_s: float) -> None:
    for w in workers:
        w.stop()
    for w in workers:
        w.join(timeout_s)
        if w.is_alive():
            log.error("%s did not stop within %.0fs", w.name, timeout_s)
