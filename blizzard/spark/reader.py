"""The streaming read: the driver leases ids from the master, executors fetch the payloads.

Where each part runs (Spark >= 4.2, measured here):

- ``BlizzardStreamReader`` is built twice: in a planner process, which pickles it along with
  ``read`` for the executors, and in a long-lived runner process on the driver that Spark asks
  for offsets, partitions and commits. Only the runner opens sockets, lazily (``_Driver``), so
  the pickled copy carries nothing but options.
- ``read(partition)`` runs on executors: a fresh ``Client`` fetches the payloads straight from
  the data nodes (one partition per data node), failing over to other replicas.

Acknowledgement: an offset names one leased batch, ``{"run": ..., "batch": n}``. Spark asks for
the next offset, ``latestOffset(start)``, only once the batch ending at ``start`` has been
written by the sink and recorded in the query's commit log, so that is where its items are
acked; ``commit(end)`` comes one batch later and never for the last batch, so it only repeats
the ack. Until then a keep-alive thread extends the leases. Spark kills the runner without
calling ``stop()`` when a query stops or fails; its leases then simply run out and the items
come back: nothing is lost, some items may be delivered twice (at least once).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from blizzard.client.core import Client, ShardedClient
from blizzard.spark.fetch import read_partition
from blizzard.spark.options import ReadOptions
from blizzard.spark.plan import Batch, NodePartition, plan_partitions, settle_columns
from blizzard.spark.timings import Timings
from blizzard.wire import protocol as p
from blizzard.wire.errors import NOT_HELD, ClusterError
from blizzard.wire.protocol import MAX_BATCH

log = logging.getLogger(__name__)

PROBE_ITEMS = 32  # first lease of a batch, to learn the payload size before leasing the rest
ALL_AVAILABLE_ITEMS = 100_000  # "read all available" of an unbounded queue, for one batch
STALE_ROUNDS = 3  # availableNow: batches of nothing but redeliveries before giving up
# The next batch is leased ahead only with leases this long: its read grant ends with the
# leases it was issued with (extending them does not renew it), and it is read only after
# the batch before it has been written.
LEASE_AHEAD_MIN_S = 20.0
ACK_TRIES = 3  # a written batch's acks are sent this many times before its items come back


class BlizzardStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of leased items; see the module docstring for who runs what."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self.run = uuid.uuid4().hex[:12]  # offsets of another run (a restart) name no batch here
        self._driver: _Driver | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "run": self.run, "_driver": None}

    def driver(self) -> _Driver:
        if self._driver is None:
            self._driver = _Driver(self.opts, self.run)
        return self._driver

    # -- driver side (the runner process) ----------------------------------------------------

    def initialOffset(self) -> dict:
        return {"run": self.run, "batch": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.opts.max_items_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        self.driver().prepare_available_now()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        return self.driver().next_batch(start, limit)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return self.driver().partitions(end)

    def commit(self, end: dict) -> None:
        self.driver().settle(end)

    def stop(self) -> None:
        if self._driver is not None:
            self._driver.close()
            self._driver = None

    # -- executor side -----------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, NodePartition)
        return read_partition(self.opts, partition)


def _mark_delivered(batch: Batch, seen: set[int]) -> None:
    """Count items this run has handed out before as delivered (``attempts`` at least 1),
    even if the master's count says 0 (it lost a lease that was answered before its fsync):
    ``drain`` checks only redeliveries against what it wrote. The batch is planned anew."""
    for reply in batch.replies:
        attempts = reply.attempts
        for k, item_id in enumerate(reply.ids):
            if attempts[k] == 0 and item_id in seen:
                attempts[k] = 1
    batch.plan = None


def _alive(client: Client) -> set[str]:
    """The data nodes the master counts as alive now."""
    return {n.node_id for n in client.status().nodes if n.alive}


class _Driver:
    """The runner's state for one query: batches leased and not yet known written, kept alive.

    The next batch is leased in the background as soon as one is handed to Spark (``ahead``,
    with leases of ``LEASE_AHEAD_MIN_S`` or more), so the master's lease work overlaps the
    writing of the batch before it; acks go out from that thread too.
    """

    def __init__(self, opts: ReadOptions, run: str) -> None:
        self.opts = opts
        self.run = run
        self.client = Client(opts.master, timeout_s=opts.timeout_s,
                             node_timeout_s=opts.node_timeout_s)
        self.lock = threading.Lock()  # guards ``batches`` and ``leased`` against other threads
        self.batches: dict[int, Batch] = {}  # batch number -> items, oldest first
        self.leased: list[Batch] = []  # leased ahead, not yet a batch (kept alive too)
        self.last = 0  # number of the last batch leased
        self.budget: int | None = None  # availableNow: new items still to take; None: unbounded
        self.seen: set[int] = set()  # availableNow: ids taken by this run (redeliveries are free)
        self.stale = 0
        self.ahead: Future[Batch] | None = None
        self.acking: list[Future[None]] = []  # acks sent from the leasing thread
        self.leaser = ThreadPoolExecutor(1, thread_name_prefix="blizzard-lease-ahead")
        self.ahead_client = Client(opts.master, timeout_s=opts.timeout_s)  # the leaser's own
        self.timings = Timings(opts.timings_dir, "driver")
        self.stopping = threading.Event()
        self.keeper = threading.Thread(target=self._keep_alive, name="blizzard-lease-keeper",
                                       daemon=True)
        self.keeper.start()

    def _number(self, offset: object) -> int | None:
        """The batch an offset ends, if this run leased it."""
        if isinstance(offset, dict) and offset.get("run") == self.run:
            return int(offset["batch"])
        return None

    def prepare_available_now(self) -> None:
        """Take at most what is ready now, so that a drain ends even while producers go on."""
        self.budget = self.client.stats(self.opts.queue)["ready"]
        log.info("availableNow: draining up to %d items of queue %r", self.budget, self.opts.queue)

    def next_batch(self, start: dict, limit: ReadLimit) -> dict:
        """Ack what the sink has written (everything up to ``start``), hand out the next batch
        (leased ahead, or now), and start leasing the one after."""
        self.settle(start)
        if isinstance(limit, ReadMaxRows):
            n = limit.max_rows
        elif isinstance(limit, ReadAllAvailable):
            n = ALL_AVAILABLE_ITEMS
        else:
            n = self.opts.max_items_per_batch
        want = n if self.budget is None else min(n, self.budget)
        if self.ahead is not None:
            batch, self.ahead = self.ahead.result(), None
        else:
            batch = self._lease_ahead(want, self.client) if want > 0 else Batch([])
        with self.lock:
            if batch in self.leased:
                self.leased.remove(batch)
        batch = self._count(batch)
        with self.lock:
            if len(batch):
                self.last += 1
                self.batches[self.last] = batch
        following = n if self.budget is None else min(n, self.budget)
        if len(batch) and following > 0 and self.opts.lease_s >= LEASE_AHEAD_MIN_S:
            self.ahead = self.leaser.submit(self._lease_ahead, following, self.ahead_client)
        if not len(batch):
            self.wait_for_acks()  # the query may end now: the last acks must be in
            return start
        return {"run": self.run, "batch": self.last}

    def _count(self, batch: Batch) -> Batch:
        """availableNow: charge the batch's new items to the budget; give up on items that
        come back again and again (no executor could read them)."""
        if self.budget is None or not len(batch):
            return batch
        ids = batch.ids
        fresh = [i for i in ids if i not in self.seen]
        self.stale = 0 if fresh else self.stale + 1
        if self.stale >= STALE_ROUNDS:
            log.warning("giving up on %d items that could not be read %d times in a row",
                        len(ids), STALE_ROUNDS)
            self._give_back([batch])
            return Batch([])
        if len(fresh) < len(ids):
            _mark_delivered(batch, self.seen)
        self.seen.update(fresh)
        self.budget -= len(fresh)
        return batch

    def _lease_ahead(self, n: int, client: Client) -> Batch:
        """Lease a batch with ``client`` and keep it alive from then on."""
        started = time.monotonic()
        batch = self._lease(n, client)
        self.timings.add("driver lease", time.monotonic() - started, len(batch))
        with self.lock:
            self.leased.append(batch)
        if len(batch):  # planned here, off the path Spark waits on (else in ``partitions``)
            try:
                with self.timings.stage("partition planning", len(batch)):
                    batch.plan = plan_partitions(batch, _alive(client))
            except ClusterError as exc:
                log.warning("could not ask the master which data nodes are alive: %s", exc)
        return batch

    def _lease(self, n: int, client: Client) -> Batch:
        """Up to ``n`` items and about ``max_bytes_per_batch`` payload bytes, in a few leases."""
        replies: list[p.Leased] = []
        taken_at = time.monotonic()  # the leases run from (a little after) now
        count = size = 0
        wait_s = self.opts.wait_s if self.budget is None else 0.0
        while count < n and size < self.opts.max_bytes_per_batch:
            want = min(n - count, MAX_BATCH)
            if not count:
                want = min(want, PROBE_ITEMS)
            else:
                room = self.opts.max_bytes_per_batch - size
                want = min(want, max(1, int(room / max(1.0, size / count))))
            got = client.lease_columns(self.opts.queue, want, lease_s=self.opts.lease_s,
                                       wait_s=wait_s)
            wait_s = 0.0
            if got.ids:
                replies.append(got)
            count += len(got.ids)
            size += sum(got.sizes)
            if not got.ids or len(got.ids) < want and not isinstance(client, ShardedClient):
                break  # (a shard ran short: the others may hold more)
        return Batch(replies, taken_at)

    def partitions(self, end: dict) -> list[NodePartition]:
        number = self._number(end)
        with self.lock:
            batch = self.batches.get(number) if number is not None else None
        if batch is None or not len(batch):  # a batch of an earlier run: its leases run out
            return []
        if batch.plan is not None:  # planned when it was leased
            plan, batch.plan = batch.plan, None
            return plan
        return plan_partitions(batch, _alive(self.client))  # asked again: the nodes now

    def settle(self, offset: dict) -> None:
        """Ack every batch up to the one ending at ``offset``: the sink has written them.

        The acks go out from the leasing thread, while Spark carries on with the next batch;
        ``wait_for_acks`` waits until they are done.
        """
        number = self._number(offset)
        if number is None:
            return
        with self.lock:  # out of ``batches`` first: the keeper extends no batch being acked
            done = [self.batches.pop(b) for b in sorted(self.batches) if b <= number]
        if done:
            self.acking = [f for f in self.acking if not f.done()]
            self.acking.append(self.leaser.submit(self._ack, done, self.ahead_client))

    def _ack(self, done: list[Batch], client: Client) -> None:
        started = time.monotonic()
        ids, leases = settle_columns(done)
        for attempt in range(ACK_TRIES):  # an ack is idempotent: acked under this lease is done
            try:
                client.ack_ids(ids, leases)
                break
            except NOT_HELD as exc:  # given back by an executor, or a lease ran out
                log.warning("some acks came too late; those items will be delivered again: %s",
                            exc)
                break
            except ClusterError as exc:  # their leases run out: delivered again, not lost
                log.warning("could not ack %d written items%s: %s", len(ids),
                            "; they will be delivered again" if attempt == ACK_TRIES - 1
                            else ", trying again", exc)
        self.timings.add("acks", time.monotonic() - started, len(ids))

    def wait_for_acks(self) -> None:
        """Wait for the acks sent so far."""
        for future in self.acking:
            future.result()
        self.acking.clear()

    def _keep_alive(self) -> None:
        """Extend each batch's leases once a third of the lease has passed since they were
        taken or last extended (a batch written sooner is never extended)."""
        renew_s = max(0.1, self.opts.lease_s / 3)
        with Client(self.opts.master, timeout_s=min(self.opts.timeout_s, renew_s)) as client:
            while not self.stopping.wait(renew_s / 2):
                with self.lock:  # held so that an ack cannot race an extend of the same items
                    now = time.monotonic()
                    due = [b for b in (*self.batches.values(), *self.leased)
                           if now - b.renewed >= renew_s]
                    ids, leases = settle_columns(due)
                    if not ids:
                        continue
                    try:
                        client.extend_ids(ids, leases, lease_s=self.opts.lease_s)
                        for b in due:
                            b.renewed = now
                        self.timings.add("lease keep-alive", time.monotonic() - now, len(ids))
                    except NOT_HELD as exc:
                        log.warning("leases lost while in flight (those items will be delivered "
                                    "again): %s", exc)
                        for b in due:  # the others were extended
                            b.renewed = now
                    except ClusterError as exc:
                        log.warning("could not extend %d leases (retrying): %s", len(ids), exc)

    def _give_back(self, batches: list[Batch]) -> None:
        ids, leases = settle_columns(batches)
        if not ids:
            return
        try:
            self.client.nack_ids(ids, leases, delay_s=0.0)
        except NOT_HELD + (ClusterError,) as exc:  # their leases will run out instead
            log.warning("could not give back %d items: %s", len(ids), exc)

    def close(self) -> None:
        """Best effort: Spark usually kills the runner instead of calling ``stop()``."""
        self.stopping.set()
        self.leaser.shutdown(wait=True)  # a lease ahead in flight ends within wait_s
        with self.lock:
            held = [*self.batches.values(), *self.leased]
            self.batches.clear()
            self.leased.clear()
        self._give_back(held)
        self.ahead_client.close()
        self.client.close()
