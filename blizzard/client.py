"""The Python client: enqueue (alloc -> put -> commit) and dequeue (lease -> get -> ack).

A ``Client`` owns ZeroMQ sockets and is not thread-safe: use one per thread. Payload bytes
go straight to data nodes; the master only sees ids, sizes and checksums.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
import uuid
import zlib
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import zmq

from blizzard import protocol as p
from blizzard.admin import QueueAdmin
from blizzard.errors import (DatanodeUnavailable, InvalidArgument, LeaseExpired,
                             MasterUnavailable, NotEnoughDatanodes, UnknownItem)
from blizzard.messages import Consumer, EnqueueOptions, LeasedItem, Message, as_bytes
from blizzard.nodes import NodeAccess
from blizzard.transport import Endpoint, call_many, raise_if_error

if TYPE_CHECKING:
    from blizzard.producer import Producer

__all__ = ["Client", "Consumer", "EnqueueOptions", "LeasedItem", "Message"]

log = logging.getLogger(__name__)

CHUNK_ITEMS = 1000  # items per alloc/put/commit round
CHUNK_BYTES = 16 * 1024 * 1024
PUT_ATTEMPTS = 4
ATTEMPT_S = 2.0  # one try at a master request before it is sent again (a restart loses it)
RETRYABLE = {"master_starting"}


class Client(QueueAdmin, NodeAccess):
    """A connection to one Blizzard cluster, addressed by its master."""

    def __init__(self, master: str = "tcp://127.0.0.1:5555", *, timeout_s: float = 30.0,
                 node_timeout_s: float = 5.0, ctx: zmq.Context | None = None) -> None:
        """``timeout_s`` bounds each call: master requests are retried with back-off until then,
        so a master restart is ridden through; past it, ``MasterUnavailable``.
        ``node_timeout_s`` is how long one data node may take before another replica is tried."""
        if timeout_s <= 0 or node_timeout_s <= 0:
            raise InvalidArgument("timeout_s and node_timeout_s must be positive")
        self.node_timeout_s = min(node_timeout_s, timeout_s)
        self.ctx = ctx or zmq.Context.instance()
        self.timeout_s = timeout_s
        self.master = Endpoint(self.ctx, master)
        self.nodes: dict[str, Endpoint] = {}
        self._suspects: dict[str, float] = {}  # node id -> monotonic time it is trusted again
        self._calls = (f"{uuid.uuid4().hex[:16]}-{n}" for n in itertools.count())

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self.master.close()
        for ep in self.nodes.values():
            ep.close()
        self.nodes.clear()

    # -- plumbing ----------------------------------------------------------------------------

    def _master_many(self, msgs: list[Any], extra_s: float = 0.0,
                     raise_errors: bool = True) -> list[Any]:
        """Send requests to the master, retrying timeouts with back-off until the deadline.

        Retrying is safe: allocs are cheap to repeat, commits and acks are idempotent, and a
        lease carries a request id so its retry returns the same items.
        """
        deadline = time.monotonic() + self.timeout_s + extra_s
        results: list[Any] = [None] * len(msgs)
        todo = list(range(len(msgs)))
        pause = 0.05
        while True:
            attempt_s = min(deadline - time.monotonic(), ATTEMPT_S + extra_s)
            replies = call_many([(self.master, msgs[i]) for i in todo], max(attempt_s, 0.01))
            again = []
            for i, reply in zip(todo, replies):
                results[i] = reply
                if isinstance(reply, TimeoutError) or (isinstance(reply, p.Error)
                                                       and reply.code in RETRYABLE):
                    again.append(i)
            if not again:
                return [raise_if_error(r) for r in results] if raise_errors else results
            if time.monotonic() + pause >= deadline:
                last = results[again[0]]
                if isinstance(last, p.Error):
                    raise_if_error(last)
                raise MasterUnavailable(f"master {self.master.addr} did not answer within "
                                        f"{self.timeout_s + extra_s:g}s")
            time.sleep(pause)
            pause = min(1.0, pause * 2)
            todo = again

    def _master(self, msg: Any, extra_s: float = 0.0) -> Any:
        return self._master_many([msg], extra_s)[0]

    # -- enqueue -----------------------------------------------------------------------------

    def enqueue(self, queue: str, data: bytes, *, priority: int = 0, delay_s: float = 0.0,
                not_before: Any = None, key: str | None = None, coalesce: bool = False) -> int:
        """Add one item; returns its id once the item is durably stored and committed.

        ``priority``: lower is served first (equal priorities FIFO). ``delay_s`` or
        ``not_before`` (datetime or unix time): invisible until then. ``key``: items sharing
        a key are never leased at the same time. ``coalesce``: this item replaces the waiting
        items with its key (latest data, best priority and earliest place in line kept).
        """
        return self.enqueue_many(queue, [data], priority=priority, delay_s=delay_s,
                                 not_before=not_before, key=key, coalesce=coalesce)[0]

    def enqueue_many(self, queue: str, items: Iterable[bytes], *, priority: int = 0,
                     delay_s: float = 0.0, not_before: Any = None, key: str | None = None,
                     coalesce: bool = False) -> list[int]:
        """Add items in order; returns their ids once all are durable and visible.

        A chunk whose pending enqueue the master forgot (it restarted between alloc and
        commit) is staged and committed again: nothing of it was visible, so nothing doubles.
        """
        opts = EnqueueOptions.make(priority, delay_s, not_before, key, coalesce)
        chunks = self._chunks(items)
        ids: list[int] = []
        for start in range(0, len(chunks), 8):  # up to 8 chunks in flight at once
            group = chunks[start:start + 8]
            staged = self._stage_chunks(queue, group, opts)
            for attempt in range(PUT_ATTEMPTS):
                replies = self._master_many([p.Commit(i, n, next(self._calls)) for i, n in staged],
                                            raise_errors=False)
                redo = [k for k, r in enumerate(replies)
                        if isinstance(r, p.Error) and r.code == UnknownItem.code]
                if not redo or attempt == PUT_ATTEMPTS - 1:
                    for r in replies:
                        raise_if_error(r)
                    break
                log.warning("the master forgot %d pending chunks (restarted?); staging them again",
                            len(redo))
                again = self._stage_chunks(queue, [group[k] for k in redo], opts)
                for k, fresh in zip(redo, again):
                    staged[k] = fresh
            ids += [i for chunk_ids, _ in staged for i in chunk_ids]
        return ids

    def producer(self, queue: str, *, window: int = 4, **options: Any) -> "Producer":
        """A pipelining producer for ``queue``: ``send`` batches, ``flush`` for their ids.

        Up to ``window`` batches are in flight at once; options are ``enqueue``'s.
        """
        from blizzard.producer import Producer
        return Producer(self, queue, window=window, **options)

    def stage(self, queue: str, items: Iterable[bytes], *, priority: int = 0, delay_s: float = 0.0,
              key: str | None = None) -> list[tuple[list[int], list[str]]]:
        """Phases 1-2 of an enqueue: ids allocated, payloads durable on data nodes, nothing visible.

        Returns (ids, node ids) per chunk for ``commit``; if it is never committed, the master
        drops the items after its pending timeout and deletes their blobs.
        """
        opts = EnqueueOptions.make(priority, delay_s, None, key)
        chunks = self._chunks(items)
        staged: list[tuple[list[int], list[str]]] = []
        for start in range(0, len(chunks), 8):
            staged += self._stage_chunks(queue, chunks[start:start + 8], opts)
        return staged

    def _chunks(self, items: Iterable[bytes]) -> list[list[bytes]]:
        chunks: list[list[bytes]] = [[]]
        size = 0
        for blob in map(as_bytes, items):
            if len(chunks[-1]) >= CHUNK_ITEMS or (size + len(blob) > CHUNK_BYTES and chunks[-1]):
                chunks.append([])
                size = 0
            chunks[-1].append(blob)
            size += len(blob)
        return chunks if chunks[0] else []

    def commit(self, staged: list[tuple[list[int], list[str]]]) -> None:
        """Phase 3: make staged items visible, all chunks in one round trip (idempotent)."""
        if staged:
            self._master_many([p.Commit(ids, nodes, next(self._calls)) for ids, nodes in staged])

    def _stage_chunks(self, queue: str, chunks: list[list[bytes]],
                      opts: EnqueueOptions) -> list[tuple[list[int], list[str]]]:
        crcs = [[zlib.crc32(b) for b in chunk] for chunk in chunks]
        allocs = [p.Alloc(queue, [len(b) for b in chunk], c, [opts.priority] * len(chunk),
                          [opts.delay_s] * len(chunk), [opts.key] * len(chunk), opts.coalesce,
                          self.suspected())
                  for chunk, c in zip(chunks, crcs)]
        placements = self._place(allocs)
        stored = self._put_all(placements, chunks, crcs)
        for i in range(len(chunks)):
            for attempt in range(PUT_ATTEMPTS):
                if isinstance(stored[i], p.Stored):
                    break
                error, bad = stored[i]
                if attempt == PUT_ATTEMPTS - 1:
                    raise error
                # Only the latest culprits are avoided: a node that merely waited on a dead
                # replica is fine again next time, and excluding too many fails the placement.
                log.warning("put failed (%s); asking for a placement without %s", error, sorted(bad))
                self._suspect(bad)
                allocs[i] = dataclasses.replace(allocs[i], exclude=sorted(bad))
                placements[i] = self._master(allocs[i])  # too few nodes without them: an error
                stored[i] = self._put_all([placements[i]], [chunks[i]], [crcs[i]])[0]
        return [(pl.ids, s.nodes) for pl, s in zip(placements, stored)]

    def _place(self, allocs: list[p.Alloc]) -> list[p.Placement]:
        """Placements for allocs that avoid suspected nodes; where that leaves too few nodes,
        asked again without (a suspect is better than no write at all)."""
        replies = self._master_many(allocs, raise_errors=False)
        redo = [k for k, r in enumerate(replies) if allocs[k].exclude and isinstance(r, p.Error)
                and r.code == NotEnoughDatanodes.code]
        if redo:
            again = self._master_many([dataclasses.replace(allocs[k], exclude=[]) for k in redo],
                                      raise_errors=False)
            for k, reply in zip(redo, again):
                replies[k] = reply
        return [raise_if_error(r) for r in replies]

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
        if not items:
            return []
        payloads, failed = self.fetch(items)
        if failed:
            log.warning("%d leased items could not be read from any replica; releasing them",
                        len(failed))
            self._master(p.Nack([i.id for i in failed], [i.lease for i in failed], 1.0,
                                "no replica could be read"))
            if not payloads:
                raise DatanodeUnavailable(f"no replica of items {[i.id for i in failed][:5]} "
                                          "could be read")
        return [Message(i.id, payloads[i.id], queue, i.attempts, i.priority, i.enqueued_at,
                        i.lease, self) for i in items if i.id in payloads]

    def lease(self, queue: str, n: int, *, lease_s: float | None = None, wait_s: float = 0.0,
              ack: Sequence[Any] = ()) -> list[LeasedItem]:
        """Lease up to ``n`` items without reading them (ids, leases, replica locations).

        ``lease_s`` None: the queue's configured lease.
        """
        if type(n) is not int:
            raise InvalidArgument("n must be an integer")
        if lease_s is None:
            lease_s = 0.0  # the master applies the queue's default
        elif not isinstance(lease_s, bool) and isinstance(lease_s, (int, float)) and lease_s <= 0:
            raise InvalidArgument(f"lease_s must be positive, got {lease_s!r}")
        if isinstance(lease_s, bool) or not isinstance(lease_s, (int, float)) \
                or isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)):
            raise InvalidArgument("lease_s and wait_s must be numbers of seconds")
        leased: p.Leased = self._master(
            p.Lease(queue, n, float(lease_s), float(wait_s), next(self._calls),
                    [m.id for m in ack], [m.lease for m in ack]),
            extra_s=float(wait_s) if wait_s > 0 else 0.0)
        items = self._leased_items(leased)
        if leased.lost:
            if items:
                self._master(p.Nack([i.id for i in items], [i.lease for i in items], 0.0, ""))
            raise LeaseExpired(f"the lease on items {leased.lost[:10]} expired before the ack; "
                               "another consumer may hold them")
        return items

    @staticmethod
    def _leased_items(leased: p.Leased) -> list[LeasedItem]:
        return [LeasedItem(leased.ids[i], leased.leases[i], leased.sizes[i], leased.crcs[i],
                           leased.attempts[i], leased.priorities[i], leased.enqueued_at[i],
                           leased.replica_sets[leased.replica_set[i]].nodes, leased.keys[i])
                for i in range(len(leased.ids))]

    def consume(self, queue: str, n: int = 100, *, lease_s: float | None = None,
                wait_s: float = 1.0) -> "Consumer":
        """Batches from ``queue``, each acked together with the next lease (one round trip).

        ``with c.consume("jobs") as batches: for msgs in batches: ...`` -- a batch counts as
        done when the loop asks for the next one; leaving the block normally acks the last
        batch, leaving it by an exception gives the unfinished batch back.
        """
        return Consumer(self, queue, n, lease_s, wait_s)

    def extend_many(self, msgs: Sequence[Any], *, lease_s: float) -> None:
        """Extend leases to ``lease_s`` seconds from now; ``LeaseExpired`` if one was lost."""
        self._settle(msgs, lambda ids, leases: p.Extend(ids, leases, float(lease_s)))

    def ack_many(self, msgs: Sequence[Any]) -> None:
        """Finish leased messages; raises ``LeaseExpired`` naming any whose lease was lost."""
        self._settle(msgs, lambda ids, leases: p.Ack(ids, leases))

    def nack_many(self, msgs: Sequence[Any], *, delay_s: float | None = None,
                  error: str = "") -> None:
        """Give leased messages back: after ``delay_s``, or (None) the queue's retry back-off."""
        delay = None if delay_s is None else float(delay_s)
        self._settle(msgs, lambda ids, leases: p.Nack(ids, leases, delay, str(error)))

    def _settle(self, msgs: Sequence[Any], make: Any) -> None:
        lost: list[int] = []
        for start in range(0, len(msgs), p.MAX_BATCH):
            part = msgs[start:start + p.MAX_BATCH]
            reply: p.Acked = self._master(make([m.id for m in part], [m.lease for m in part]))
            lost += reply.lost
        if lost:
            raise LeaseExpired(f"the lease on items {lost[:10]} expired before this call; "
                               "another consumer may hold them")

    # -- inspection --------------------------------------------------------------------------

