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

import dataclasses
import logging
import threading
import uuid
from collections import defaultdict
from typing import Any, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                              SupportsTriggerAvailableNow)

from blizzard.client import Client
from blizzard.errors import ClusterError, LeaseExpired
from blizzard.message import LeasedItem
from blizzard.protocol import MAX_BATCH
from blizzard.spark.fetch import NodePartition, read_partition
from blizzard.spark.options import ReadOptions

log = logging.getLogger(__name__)

PROBE_ITEMS = 32  # first lease of a batch, to learn the payload size before leasing the rest
ALL_AVAILABLE_ITEMS = 100_000  # "read all available" of an unbounded queue, for one batch
STALE_ROUNDS = 3  # availableNow: batches of nothing but redeliveries before giving up


class BlizzardStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of leased items; see the module docstring for who runs what."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self.run = uuid.uuid4().hex[:12]  # offsets of another run (a restart) name no batch here
        self._driver: _Driver | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "run": self.run, "_driver": None}

    def driver(self) -> "_Driver":
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


class _Driver:
    """The runner's state for one query: batches leased and not yet known written, kept alive."""

    def __init__(self, opts: ReadOptions, run: str) -> None:
        self.opts = opts
        self.run = run
        self.client = Client(opts.master, timeout_s=opts.timeout_s,
                             node_timeout_s=opts.node_timeout_s)
        self.lock = threading.Lock()  # guards ``batches`` against the keep-alive thread
        self.batches: dict[int, list[LeasedItem]] = {}  # batch number -> items, oldest first
        self.last = 0  # number of the last batch leased
        self.budget: int | None = None  # availableNow: new items still to take; None: unbounded
        self.seen: set[int] = set()  # availableNow: ids taken by this run (redeliveries are free)
        self.stale = 0
        self.stopping = threading.Event()
        self.keeper = threading.Thread(target=self._keep_alive, name="blizzard-lease-keeper",
                                       daemon=True)
        self.keeper.start()

    def _number(self, offset: dict) -> int | None:
        """The batch an offset ends, if this run leased it."""
        if isinstance(offset, dict) and offset.get("run") == self.run:
            return int(offset["batch"])
        return None

    def prepare_available_now(self) -> None:
        """Take at most what is ready now, so that a drain ends even while producers go on."""
        self.budget = self.client.stats(self.opts.queue)["ready"]
        log.info("availableNow: draining up to %d items of queue %r", self.budget, self.opts.queue)

    def next_batch(self, start: dict, limit: ReadLimit) -> dict:
        """Ack what the sink has written (everything up to ``start``), lease the next batch."""
        self.settle(start)
        if isinstance(limit, ReadMaxRows):
            n = limit.max_rows
        elif isinstance(limit, ReadAllAvailable):
            n = ALL_AVAILABLE_ITEMS
        else:
            n = self.opts.max_items_per_batch
        if self.budget is not None:
            n = min(n, self.budget)
        items = self._lease(n) if n > 0 else []
        if self.budget is not None and items:
            fresh = [i for i in items if i.id not in self.seen]
            self.stale = 0 if fresh else self.stale + 1
            if self.stale >= STALE_ROUNDS:  # only items no executor could read, again and again
                log.warning("giving up on %d items that could not be read %d times in a row",
                            len(items), STALE_ROUNDS)
                self._give_back(items)
                items = []
            self.seen.update(i.id for i in fresh)
            self.budget -= len(fresh)
        if not items:
            return start
        with self.lock:
            self.last += 1
            self.batches[self.last] = items
        return {"run": self.run, "batch": self.last}

    def _lease(self, n: int) -> list[LeasedItem]:
        """Up to ``n`` items and about ``max_bytes_per_batch`` payload bytes, in a few leases."""
        items: list[LeasedItem] = []
        size = 0
        wait_s = self.opts.wait_s if self.budget is None else 0.0
        while len(items) < n and size < self.opts.max_bytes_per_batch:
            want = min(n - len(items), MAX_BATCH)
            if not items:
                want = min(want, PROBE_ITEMS)
            else:
                room = self.opts.max_bytes_per_batch - size
                want = min(want, max(1, int(room / max(1.0, size / len(items)))))
            got = self.client.lease(self.opts.queue, want, lease_s=self.opts.lease_s, wait_s=wait_s)
            wait_s = 0.0
            items += got
            size += sum(i.size for i in got)
            if len(got) < want:
                break
        return items

    def partitions(self, end: dict) -> list[NodePartition]:
        number = self._number(end)
        with self.lock:
            items = self.batches.get(number) if number is not None else None
        if not items:  # nothing, or a batch of an earlier run: its leases run out, items return
            return []
        alive = {n.node_id for n in self.client.status().nodes if n.alive}
        return plan_partitions(items, alive)

    def settle(self, offset: dict) -> None:
        """Ack every batch up to the one ending at ``offset``: the sink has written them."""
        number = self._number(offset)
        if number is None:
            return
        with self.lock:
            done = [b for b in self.batches if b <= number]
            items = [i for b in done for i in self.batches[b]]
            if items:
                try:
                    self.client.ack_many(items)
                except LeaseExpired as exc:  # given back by an executor, or a lease ran out
                    log.warning("some acks came too late; those items will be delivered again: %s",
                                exc)
            for b in done:
                del self.batches[b]

    def _keep_alive(self) -> None:
        every_s = max(0.1, self.opts.lease_s / 3)
        with Client(self.opts.master, timeout_s=min(self.opts.timeout_s, every_s)) as client:
            while not self.stopping.wait(every_s):
                with self.lock:  # held so that an ack cannot race an extend of the same items
                    items = [i for b in self.batches.values() for i in b]
                    if not items:
                        continue
                    try:
                        client.extend_many(items, lease_s=self.opts.lease_s)
                    except LeaseExpired as exc:
                        log.warning("leases lost while in flight (those items will be delivered "
                                    "again): %s", exc)
                    except ClusterError as exc:
                        log.warning("could not extend %d leases (retrying): %s", len(items), exc)

    def _give_back(self, items: list[LeasedItem]) -> None:
        try:
            self.client.nack_many(items, delay_s=0.0)
        except (LeaseExpired, ClusterError) as exc:  # their leases will run out instead
            log.warning("could not give back %d items: %s", len(items), exc)

    def close(self) -> None:
        """Best effort: Spark usually kills the runner instead of calling ``stop()``."""
        self.stopping.set()
        with self.lock:
            items = [i for b in self.batches.values() for i in b]
            self.batches.clear()
        if items:
            self._give_back(items)
        self.client.close()


def plan_partitions(items: list[LeasedItem], alive: set[str]) -> list[NodePartition]:
    """One partition per data node: each item goes to its least loaded live replica.

    The chosen replica is put first in the item's node list, the other live ones next, so an
    executor tries them in that order.
    """
    load: dict[str, int] = defaultdict(int)
    groups: dict[str, list[LeasedItem]] = defaultdict(list)
    for item in items:
        usable = [n for n in item.nodes if n.addr]
        live = [n for n in usable if n.node_id in alive] or usable
        if not live:
            groups[""].append(item)  # no known replica: the executor gives it back
            continue
        best = min(live, key=lambda n: load[n.node_id])  # ties: the master's order
        load[best.node_id] += max(item.size, 1)
        rest = [n for n in live if n is not best] + [n for n in item.nodes if n not in live]
        groups[best.addr].append(dataclasses.replace(item, nodes=[best, *rest]))
    return [NodePartition(addr, group) for addr, group in groups.items()]
