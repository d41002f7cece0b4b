"""A pipelining producer: several enqueue batches in flight on one client.

Each batch goes alloc -> put -> commit as in ``Client.enqueue_many``, but ``send`` returns as
soon as the batch is under way, so the round trips and fsyncs of up to ``window`` batches
overlap. A batch is acknowledged (its ids returned by ``flush``) only after its commit is
durable. A batch whose step fails or times out is finished the synchronous way, with
``enqueue_many``'s retries and re-placement (a commit is first resent under its request id,
so a commit that landed is never enqueued twice).
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

import zmq

from blizzard import protocol as p
from blizzard.errors import UnknownItem
from blizzard.messages import EnqueueOptions, as_bytes
from blizzard.transport import Endpoint

if TYPE_CHECKING:
    from blizzard.client import Client

ALLOC, PUT, COMMIT, DONE = range(4)


@dataclass
class _Batch:
    items: list[bytes]
    crcs: list[int]
    step: int = ALLOC
    ep: Endpoint | None = None
    rid: int = 0
    until: float = 0.0
    placement: p.Placement | None = None
    commit: p.Commit | None = None
    ids: list[int] = field(default_factory=list)


class Producer:
    """``with client.producer("jobs") as prod: prod.send(batch) ...; ids = prod.flush()``."""

    def __init__(self, client: "Client", queue: str, *, window: int = 4, priority: int = 0,
                 delay_s: float = 0.0, key: str | None = None, coalesce: bool = False) -> None:
        self.client = client
        self.queue = queue
        self.window = max(1, window)
        self.opts = EnqueueOptions.make(priority, delay_s, None, key, coalesce)
        self.batches: list[_Batch] = []  # in send order, done ones until flushed

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.flush()

    def send(self, items: Iterable[bytes]) -> None:
        """Start enqueueing one batch (at most ``protocol.MAX_BATCH`` items); waits only while
        ``window`` batches are already in flight."""
        blobs = [as_bytes(b) for b in items]
        if not blobs:
            return
        while sum(1 for b in self.batches if b.step != DONE) >= self.window:
            self._pump(block=True)
        batch = _Batch(blobs, [zlib.crc32(b) for b in blobs])
        n = len(blobs)
        o = self.opts
        self._request(batch, self.client.master, p.Alloc(
            self.queue, [len(b) for b in blobs], batch.crcs, [o.priority] * n, [o.delay_s] * n,
            [o.key] * n, o.coalesce, self.client.suspected()), self._master_wait())
        self.batches.append(batch)
        self._pump(block=False)

    def flush(self) -> list[int]:
        """Wait for every batch sent so far; return their ids in send order."""
        while any(b.step != DONE for b in self.batches):
            self._pump(block=True)
        ids = [i for b in self.batches for i in b.ids]
        self.batches.clear()
        return ids

    # -- the state machine -------------------------------------------------------------------

    def _master_wait(self) -> float:
        from blizzard.client import ATTEMPT_S
        return time.monotonic() + ATTEMPT_S

    def _request(self, batch: _Batch, ep: Endpoint, msg: Any, until: float) -> None:
        try:
            batch.ep, batch.rid, batch.until = ep, ep.send(msg), until
        except TimeoutError:
            batch.until = 0.0  # handled as a timeout on the next pump

    def _pump(self, block: bool) -> None:
        live = [b for b in self.batches if b.step != DONE]
        if not live:
            return
        if block and not any(b.ep is not None and b.rid in b.ep.received() for b in live):
            wait_ms = max(0, int((min(b.until for b in live) - time.monotonic()) * 1000))
            poller = zmq.Poller()
            for ep in {b.ep for b in live if b.ep is not None}:
                poller.register(ep._socket(), zmq.POLLIN)
            poller.poll(wait_ms)
        for ep in {b.ep for b in live if b.ep is not None}:
            sock = ep._socket()
            while sock.poll(0, zmq.POLLIN):
                ep.read_one()
        now = time.monotonic()
        for b in live:
            reply = b.ep.take(b.rid) if b.ep is not None else None
            if reply is not None:
                self._advance(b, reply)
            elif b.until <= now:
                self._finish_slowly(b)

    def _advance(self, b: _Batch, reply: Any) -> None:
        if b.step == ALLOC and isinstance(reply, p.Placement):
            b.placement, first = reply, reply.nodes[0]
            b.step = PUT
            self._request(b, self.client._node(first.addr),
                          p.Put(reply.ids, b.items, b.crcs, list(reply.nodes[1:]),
                                reply.min_copies, first.node_id),
                          time.monotonic() + self.client.node_timeout_s)
        elif b.step == PUT and isinstance(reply, p.Stored) and b.placement is not None \
                and len(reply.nodes) >= b.placement.min_copies:
            b.commit = p.Commit(b.placement.ids, reply.nodes, next(self.client._calls))
            b.step = COMMIT
            self._request(b, self.client.master, b.commit, self._master_wait())
        elif b.step == COMMIT and isinstance(reply, p.Committed) and b.commit is not None:
            b.ids, b.step = list(b.commit.ids), DONE
        else:  # an error or a short write: the slow path retries, or raises a real refusal
            self._finish_slowly(b)

    def _finish_slowly(self, b: _Batch) -> None:
        """Complete a batch whose step failed, synchronously and with every retry."""
        if b.step == COMMIT and b.commit is not None:
            try:
                self.client._master(b.commit)  # the same request id: applied at most once
                b.ids, b.step = list(b.commit.ids), DONE
                return
            except UnknownItem:
                pass  # the master forgot the pending items: nothing is visible, stage again
        o = self.opts
        b.ids = self.client.enqueue_many(self.queue, b.items, priority=o.priority,
                                         delay_s=o.delay_s, key=o.key or None, coalesce=o.coalesce)
        b.step = DONE
