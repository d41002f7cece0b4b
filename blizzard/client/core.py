"""The Python client: enqueue (place -> put + enqueue) and dequeue (lease -> get -> ack).

``Client`` is a facade over collaborators, each in its own file: the master link
(``master_link.py``: requests retried until ``timeout_s``), the data-node pool
(``datanodes.py``: puts, reads with fail-over, nodes to avoid), the enqueue pipeline
(``pipeline.py``, also driven by ``Producer``), leases (``leases.py``: lease, ack, nack,
extend) and queue administration (``admin.py``).

A ``Client`` owns ZeroMQ sockets and is not thread-safe: use one per thread. Payload bytes
go straight to data nodes; the master only sees ids, sizes and checksums.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import zmq

from blizzard.client.admin import QueueAdmin
from blizzard.client.consumer import Consumer
from blizzard.client.datanodes import DatanodePool, Reads
from blizzard.client.enqueue_options import EnqueueOptions
from blizzard.client.http_delivery import HttpTask, enqueue_task
from blizzard.client.jobs import JobStatus, cancel_jobs, job_statuses, store_results
from blizzard.client.leases import Leases
from blizzard.client.master_link import MasterLink
from blizzard.client.message import LeasedItem, Message, leased_items
from blizzard.client.pipeline import EnqueuePipeline, Staged
from blizzard.client.producer import Producer, Stager
from blizzard.client.schedules import ScheduleStatus, list_schedules, remove_schedule, set_schedule
from blizzard.client.sharded.client import ShardedClient, split_shards
from blizzard.net.defaults import DEFAULT_MASTER
from blizzard.net.keys import ClientKeys
from blizzard.net.keys import resolve as resolve_keys
from blizzard.net.master_hints import DEFAULT, GIVEN
from blizzard.wire import protocol as p
from blizzard.wire.codec import as_ids
from blizzard.wire.errors import ClusterError, InvalidArgument
from blizzard.wire.queue_settings import check_queue_name

__all__ = ["Client", "Consumer", "ShardedClient", "EnqueueOptions", "LeasedItem", "Message",
           "Producer", "Stager"]

log = logging.getLogger(__name__)

CLOSE_WAIT_S = 2.0  # how long close() waits for acks sent without waiting to be durable


class Client:
    """A connection to one Blizzard cluster, addressed by its master; given several shards'
    masters (a list, or addresses separated by spaces), a ``ShardedClient`` over them.

    ``blizzard.connect`` does the same and says so in its type: both are ``BlizzardClient``s
    (``blizzard/client/api.py``)."""

    def __new__(cls, master: str | Sequence[str] | None = None, **options: Any) -> Any:
        shards = split_shards(DEFAULT_MASTER if master is None else master)
        if len(shards) == 1:
            return super().__new__(cls)
        return ShardedClient.open(shards, Client, **options)  # not a Client: no __init__ runs

    @classmethod
    def discover(cls, master: str | None = None, **options: Any) -> Any:
        """A client of the cluster ``master`` belongs to: given one shard's master (started
        with ``--shards``), a ``ShardedClient`` over every shard it lists; else a ``Client``."""
        with cls(master, **options) as probe:
            listed = probe.master.call(p.Hello()).shards.split()
        return cls(listed if len(listed) > 1 else master, **options)

    def __init__(self, master: str | Sequence[str] | None = None, *, timeout_s: float = 30.0,
                 node_timeout_s: float = 5.0, keys: str | ClientKeys | None = None,
                 admin: bool = False, ctx: zmq.Context[zmq.Socket[bytes]] | None = None,
                 peeks: int = 2, heads: bool = True) -> None:
        """``master``: its address (default ``tcp://127.0.0.1:5555``); a primary and its
        standbys are one string, comma-separated (``"tcp://a:5555,tcp://b:5555"``).

        ``timeout_s`` bounds each call: master requests are retried with back-off until then,
        so a master restart is ridden through; past it, ``MasterUnavailable``. Where nothing
        listens (the connection is refused) and no master answered yet, ``MasterUnavailable``
        (with ``refused``) within about 2 s. ``node_timeout_s`` is how long one data node may
        take before another replica is tried.

        ``keys``: the cluster's key directory (``blizzard cluster --data-dir D`` keeps it in
        ``D/keys``; default ``BLIZZARD_KEYS``), a ``ClientKeys``, or "" for none; without
        keys the client connects without security, which a secure cluster refuses with
        ``AuthenticationFailed``; a directory without the key files raises ``MissingKeys``
        naming them. ``admin`` uses the directory's admin key (needed to purge, redrive or
        configure queues).

        Sharded (``blizzard/client/sharded/client.py``): a dequeue leases from the shard with the
        best head among ``peeks`` shards it asks (with ``heads`` False), or among all, from the
        heads the masters publish (``heads``, the default)."""
        if timeout_s <= 0 or node_timeout_s <= 0:
            raise InvalidArgument("timeout_s and node_timeout_s must be positive")
        self.ctx: zmq.Context[zmq.Socket[bytes]] = ctx or zmq.Context.instance()
        self.timeout_s = timeout_s
        self.node_timeout_s = min(node_timeout_s, timeout_s)
        self.keys = resolve_keys(keys, "admin" if admin else "client")
        if admin and self.keys is None:
            raise InvalidArgument("admin=True needs keys (keys=DIR or BLIZZARD_KEYS)")
        self.master = MasterLink(self.ctx,
                                 split_shards(DEFAULT_MASTER if master is None else master)[0],
                                 timeout_s=timeout_s, keys=self.keys,
                                 origin=DEFAULT if master is None else GIVEN)
        self.datanodes = DatanodePool(self.ctx, node_timeout_s=self.node_timeout_s,
                                      keys=self.keys, node_key=self.master.node_key)
        self.pipeline = EnqueuePipeline(self.master, self.datanodes)
        self.leases = Leases(self.master, self.datanodes.heard, self.datanodes)
        self.admin = QueueAdmin(self.master)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Drop the connections, first waiting up to 2 s for acks not awaited to be durable;
        after it, every call raises ``ClientClosed`` (a second ``close`` does nothing)."""
        if self.master.closed:
            return
        try:
            self.leases.flush(min(self.timeout_s, CLOSE_WAIT_S))
        except Exception as exc:  # closing never fails; at worst those items come back later
            log.warning("acks sent without waiting may not have reached the master: %s", exc)
        self.master.close()
        self.datanodes.close()

    # -- enqueue -----------------------------------------------------------------------------

    def enqueue(self, queue: str, data: bytes, *, priority: int = 0, delay_s: float = 0.0,
                not_before: Any = None, key: str | None = None, coalesce: bool = False,
                unique_key: str | None = None, unique_for_s: float | None = None,
                unique_until_done: bool = False, create: bool = True,
                lease_s: float | None = None, depends_on: Iterable[int] = (),
                on_dependency_failure: str = "cancel") -> int:
        """Add one item; returns its id once the item is durably stored and committed.

        ``priority``: lower is served first (equal priorities FIFO). ``delay_s`` or
        ``not_before`` (datetime or unix time): invisible until then. ``key``: items sharing
        a key are never leased at the same time. ``coalesce``: this item replaces the waiting
        items with its key (latest data, best priority and earliest place in line kept).

        ``unique_key`` with ``unique_for_s``: if an item of this queue took the same unique
        key less than ``unique_for_s`` seconds ago (at most 30 days), no item is made and
        that item's id is returned (SQS's deduplication). ``unique_until_done``: only while
        that item is still queued or leased. The master keeps the keys in its WAL, so they
        hold across restarts and a standby's takeover. ``create=False``: a queue that does
        not exist is not made; the enqueue raises ``UnknownQueue``. ``lease_s``: the lease a
        consumer gets for this item when it names none (the queue's ``lease_s`` otherwise;
        beanstalkd's ttr), told to it as ``Message.lease_s``.

        ``depends_on``: job ids (at most 100) that must be done before this item is served
        (it waits meanwhile: status "waiting"); if one ends dead or cancelled, this one is
        cancelled (``on_dependency_failure="cancel"``) or moved to its dead-letter queue
        (``"dead"``). A dependency on an unknown, dead or cancelled job is refused.
        """
        opts = EnqueueOptions.make(priority, delay_s, not_before, key, coalesce, unique_key,
                                   unique_for_s, unique_until_done, create, lease_s,
                                   depends_on, on_dependency_failure)
        return self.pipeline.enqueue(queue, [data], opts)[0]

    def enqueue_many(self, queue: str, items: Iterable[bytes], *, priority: int = 0,
                     delay_s: float = 0.0, not_before: Any = None, key: str | None = None,
                     coalesce: bool = False) -> list[int]:
        """Add items in order; returns their ids once all are durable and visible.

        A chunk whose ids the master forgot (it restarted before the enqueue landed) is
        enqueued again under fresh ids: nothing of it was visible, so nothing doubles.
        """
        opts = EnqueueOptions.make(priority, delay_s, not_before, key, coalesce)
        return self.pipeline.enqueue(queue, items, opts)

    def enqueue_task(self, queue: str, *, url: str, method: str = "POST",
                     headers: dict[str, str] | None = None, body: bytes | str = b"",
                     max_attempts: int = 5, backoff_s: float = 2.0, timeout_s: float = 10.0,
                     priority: int = 0, delay_s: float = 0.0, key: str | None = None) -> int:
        """Add an HTTP task for ``blizzard dispatch`` (``blizzard/client/http_delivery.py``);
        its id.

        A 2xx reply within ``timeout_s`` is success; a failure is retried ``backoff_s`` later,
        at most ``max_attempts`` deliveries in all, then dead-lettered. Checked first: a bad
        URL, method, header or size raises ``InvalidArgument`` and sends nothing.
        """
        task = HttpTask.make(url, method=method, headers=headers, body=body,
                         max_attempts=max_attempts, backoff_s=backoff_s, timeout_s=timeout_s)
        return enqueue_task(self, queue, task, priority=priority, delay_s=delay_s, key=key)

    def producer(self, queue: str, *, window: int = 4, **options: Any) -> Producer:
        """A pipelining producer for ``queue``: ``send`` batches, ``flush`` for their ids.

        Up to ``window`` batches are in flight at once (a batch over 1,000 items or 16 MiB
        counts as several); options are ``enqueue``'s.
        """
        return Producer(self.pipeline, queue, window=window, **options)

    def stage(self, queue: str, items: Iterable[bytes], *, priority: int = 0, delay_s: float = 0.0,
              key: str | None = None) -> Staged:
        """Phases 1-2 of an enqueue: ids allocated, payloads durable on data nodes, nothing visible.

        Returns (ids, node ids, grants) per chunk for ``commit`` (the grants prove to a secure
        master that whoever commits staged them); if it is never committed, the master drops
        the items after its pending timeout and deletes their blobs.
        """
        return self.pipeline.stage(queue, items, EnqueueOptions.make(priority, delay_s, None, key))

    def stager(self, queue: str, *, window: int = 8, chunk_items: int = 1000) -> Stager:
        """A pipelining ``stage``: ``send`` batches (each with its own priority, delay and key),
        ``flush`` for what ``commit`` takes; up to ``window`` chunks of up to ``chunk_items``
        items (at most 10,000) are stored at once."""
        return Stager(self.pipeline, queue, window=window, chunk_items=chunk_items)

    def commit(self, staged: Staged) -> None:
        """Phase 3: make staged items visible, all chunks in one round trip (idempotent)."""
        self.pipeline.commit(staged)

    # -- dequeue -----------------------------------------------------------------------------

    def dequeue(self, queue: str, *, lease_s: float | None = None,
                wait_s: float = 0.0) -> Message | None:
        """Lease the head item and fetch its payload; ``None`` if the queue stayed empty."""
        msgs = self.dequeue_many(queue, 1, lease_s=lease_s, wait_s=wait_s)
        return msgs[0] if msgs else None

    def dequeue_many(self, queue: str, n: int, *, lease_s: float | None = None, wait_s: float = 0.0,
                     ack: Sequence[Message] = ()) -> list[Message]:
        """Lease up to ``n`` head items and fetch their payloads (fewer if fewer are ready).

        ``ack`` settles a previous batch in the same round trip to the master (raising
        ``LeaseExpired`` for any of those whose lease was lost, after the new batch is leased,
        which is then given back).
        """
        items = self.lease(queue, n, lease_s=lease_s, wait_s=wait_s, ack=ack)
        return self.deliver(queue, items) if items else []

    def deliver(self, queue: str, items: list[LeasedItem]) -> list[Message]:
        """Leased items as messages, their payloads read; items no replica can serve are
        given back (``DataCorrupt`` or ``DatanodeUnavailable`` if none could be read)."""
        reads = self._read(items)
        payloads, failed = reads.payloads, reads.failed
        if failed:
            log.warning("%d leased items could not be read from any replica; releasing them",
                        len(failed))
            self.master.call(p.Nack(as_ids([i.id for i in failed]), [i.lease for i in failed], 1.0,
                                    "no replica could be read"))
            if not payloads:
                raise reads.unreadable()  # DataCorrupt if every replica answered with a bad copy
        return self._messages(queue, items, payloads)

    def lease(self, queue: str, n: int, *, lease_s: float | None = None, wait_s: float = 0.0,
              ack: Sequence[Any] = ()) -> list[LeasedItem]:
        """Lease up to ``n`` items without reading them (ids, leases, replica locations).

        ``lease_s`` None: the queue's configured lease.
        """
        return self.leases.lease(queue, n, lease_s=lease_s, wait_s=wait_s, ack=ack)

    def lease_columns(self, queue: str, n: int, *, lease_s: float | None = None,
                      wait_s: float = 0.0) -> p.Leased:
        """``lease`` as the master's reply, one list per field and no object per item."""
        return self.leases.lease_columns(queue, n, lease_s=lease_s, wait_s=wait_s)

    def fetch(self, items: list[LeasedItem]) -> tuple[dict[int, bytes], list[LeasedItem]]:
        """Read payloads from the data nodes, trying each item's replicas in turn, checking size
        and checksum (P5); returns payloads by id and the items no replica could serve.

        Replicas that answered without a good copy are reported to the master, which copies a
        good one over them.
        """
        reads = self._read(items)
        return reads.payloads, reads.failed

    def _read(self, items: list[LeasedItem]) -> Reads:
        reads = self.datanodes.read(items)
        if reads.bad:
            try:  # a courtesy: the master re-replicates from a good copy
                self.master.call(p.BadReplica(as_ids([b[0] for b in reads.bad]),
                                              [b[1] for b in reads.bad]))
            except ClusterError as exc:
                log.warning("could not report %d bad replicas: %s", len(reads.bad), exc)
        return reads

    def peek(self, queue: str, n: int = 1) -> list[Message]:
        """The head items with payloads, without leasing them (their ``ack`` is a no-op error)."""
        items = leased_items(self.master.call(p.Peek(check_queue_name(queue), n)))
        payloads, _ = self.fetch(items) if items else ({}, [])
        return self._messages(queue, items, payloads)

    def _messages(self, queue: str, items: list[LeasedItem],
                  payloads: dict[int, bytes]) -> list[Message]:
        return [Message(i.id, payloads[i.id], queue, i.attempts, i.priority, i.enqueued_at,
                        i.lease, self.leases, i.key, i.error, i.lease_s, i.state, i.tick)
                for i in items if i.id in payloads]

    def consume(self, queue: str, n: int = 100, *, lease_s: float | None = None,
                wait_s: float = 1.0) -> Consumer:
        """Batches from ``queue``, each acked together with the next lease (one round trip).

        ``with c.consume("jobs") as batches: for msgs in batches: ...`` -- a batch counts as
        done when the loop asks for the next one; leaving the block normally acks the last
        batch, leaving it by an exception gives the unfinished batch back.
        """
        return Consumer(self, queue, n, lease_s, wait_s)

    def extend_many(self, msgs: Sequence[Any], *, lease_s: float,
                    progress: Mapping[int, tuple[float, str, bytes]] | None = None) -> list[int]:
        """Extend leases to ``lease_s`` seconds from now; ``LeaseExpired`` if one was lost.
        ``progress``: by id, (fraction done, note, state) recorded for those jobs. Returns the
        ids among them that were cancelled meanwhile (stop them)."""
        return self.leases.extend_many(msgs, lease_s=lease_s, progress=progress)

    def ack_many(self, msgs: Sequence[Any]) -> None:
        """Finish leased messages; raises ``LeaseExpired`` naming any whose lease was lost."""
        self.leases.ack_many(msgs)

    def nack_many(self, msgs: Sequence[Any], *, delay_s: float | None = None,
                  error: str = "") -> None:
        """Give leased messages back: after ``delay_s``, or (None) the queue's retry back-off."""
        self.leases.nack_many(msgs, delay_s=delay_s, error=error)

    def ack_ids(self, ids: Sequence[int], leases: Sequence[int], queue: str = "") -> None:
        """``ack_many`` by ids and lease tokens (e.g. the lists of ``lease_columns``);
        ``queue``: every id must be in it (an item of another queue is refused)."""
        self.leases.ack_ids(ids, leases, queue)

    def extend_ids(self, ids: Sequence[int], leases: Sequence[int], *, lease_s: float) -> None:
        """``extend_many`` by ids and lease tokens."""
        self.leases.extend_ids(ids, leases, lease_s=lease_s)

    def nack_ids(self, ids: Sequence[int], leases: Sequence[int], *,
                 delay_s: float | None = None, error: str = "") -> None:
        """``nack_many`` by ids and lease tokens."""
        self.leases.nack_ids(ids, leases, delay_s=delay_s, error=error)

    def suspected(self) -> list[str]:
        """Data nodes this client asks last and places nothing on for now: they failed a call
        (10 s), were slow to answer a read or store a write (5 s), or the master suspects them."""
        return self.datanodes.suspected()

    # -- jobs (blizzard/client/jobs.py) ------------------------------------------------------

    def jobs(self, ids: Sequence[int], *, wait_s: float = 0.0,
             read: bool = True) -> list[JobStatus]:
        """How jobs (items, by id) are doing, in order: status, attempts, last error,
        progress and, with ``read``, the result a worker stored. ``wait_s``: wait until
        every one of them is final (done, dead, cancelled, unknown), up to that long."""
        return job_statuses(self, ids, wait_s, read)

    def cancel(self, ids: Iterable[int]) -> list[int]:
        """Cancel jobs: a queued or delayed one is removed now, a running one's worker is
        told at its next lease extension. The ids cancelled (the rest were final already:
        done, dead or cancelled; or unknown)."""
        return cancel_jobs(self, ids)

    def store_results(self, queue: str, jobs: Sequence[Any], blobs: Sequence[bytes], *,
                      kind: int = p.RESULT_DONE, ttl_s: float = 86400.0) -> list[int]:
        """Store ``blobs`` as the results of ``jobs``, messages of ``queue`` this client
        holds the leases of, for ``ttl_s`` (what ``blizzard worker`` does before it acks a
        job); the result items' ids."""
        return store_results(self, queue, jobs, blobs, kind, ttl_s)

    # -- schedules (blizzard/client/schedules.py) --------------------------------------------

    def schedule(self, name: str, queue: str, payload: bytes, *, cron: str = "",
                 every_s: float = 0.0, timezone: str = "UTC", catch_up: bool = True,
                 overlap: bool = False) -> ScheduleStatus:
        """Make schedule ``name``: ``payload`` is enqueued to ``queue`` at each tick of
        ``cron`` (5 fields, or 6 with seconds first; in ``timezone``) or every ``every_s``
        seconds, each tick once (also across master restarts and failover), never
        overlapping its previous run (``overlap`` must be False: a tick whose previous run
        is queued or running is skipped). ``catch_up``: a tick missed while no master ran
        runs once when one is back (else it is skipped). The same schedule declared again
        is kept as it is; another spec or payload replaces it."""
        return set_schedule(self, name, queue, payload, cron=cron, every_s=every_s,
                            timezone=timezone, catch_up=catch_up, overlap=overlap)

    def schedules(self, names: Sequence[str] = ()) -> list[ScheduleStatus]:
        """The schedules named (none: all)."""
        return list_schedules(self, list(names))

    def remove_schedule(self, name: str) -> bool:
        """End schedule ``name`` (an admin's); False if there was none. A run going on
        finishes."""
        return remove_schedule(self, name)

    # -- queues and the cluster --------------------------------------------------------------

    def stats(self, queue: str) -> dict[str, Any]:
        """A queue's counters: ready, delayed, leased, pending, dead, oldest_age_s."""
        return self.admin.stats(queue)

    def queue_config(self, queue: str) -> dict[str, Any]:
        """A queue's settings (defaults for a queue never configured)."""
        return self.admin.queue_config(queue)

    def create_queue(self, queue: str, **options: Any) -> dict[str, Any]:
        """Create a queue with settings (``QueueExists`` if it exists); returns its settings."""
        return self.admin.configure(queue, True, options)

    def configure_queue(self, queue: str, **options: Any) -> dict[str, Any]:
        """Change some settings of a queue (creating it if new); returns all its settings.

        Options are the fields of ``blizzard.wire.queue_settings.Settings`` (lease_s, max_attempts,
        dead_letter, backoff_base_s, backoff_cap_s, rate_per_s, burst); an unknown one or a
        bad value raises ``InvalidArgument`` and changes nothing.
        """
        return self.admin.configure(queue, False, options)

    def queues(self) -> list[dict[str, Any]]:
        """Every queue's counters."""
        return self.admin.queues()

    def purge(self, queue: str) -> int:
        """Drop every waiting item of ``queue`` (leased ones stay); returns how many."""
        return self.admin.purge(queue)

    def redrive(self, queue: str, n: int = 10_000) -> int:
        """Move up to ``n`` dead items of ``queue`` back into it (attempts reset); how many."""
        return self.admin.redrive(queue, n)

    def status(self) -> p.ClusterStatus:
        """The cluster as the master sees it: data nodes and queues."""
        return self.admin.status()

    # -- removals (admin key) ------------------------------------------------------------------

    def delete(self, queue: str, item_id: int, *, force: bool = False) -> None:
        """Delete one ready, delayed or dead item of ``queue`` for good (a dead item by its
        dead-letter queue or the queue it died in). A leased item raises ``InUse`` unless
        ``force``; an id the queue does not hold, ``UnknownItem``."""
        if not 0 <= item_id <= p.MAX_ID:
            raise InvalidArgument(f"item id {item_id} is out of range")
        self.admin.delete_item(queue, item_id, force)

    def delete_queue(self, queue: str, *, force: bool = False) -> int:
        """Delete ``queue`` with its settings and items; returns how many items went. A queue
        with items raises ``InUse`` unless ``force``; an unknown one, ``UnknownQueue``."""
        return self.admin.delete_queue(queue, force)

    def remove_node(self, node_id: str) -> int:
        """Forget a dead data node; its items are re-replicated from their other copies.
        Returns how many items had a replica there. A live node raises ``InUse``."""
        return self.admin.remove_node(node_id)
