"""Leases this data node answers on the master's order, payloads and all
(``master/consume/pushes.py``).

The node keeps one ``AwaitServes`` parked at the master; the reply (``Serves``) holds orders,
each a lease's ``Leased`` and where its consumer is connected here. The node reads the items
(as a ``Get`` would, every blob's CRC checked by the store), sends ``Pushed`` to that
connection, and reports which orders it carried out, and which it could not (the consumer
is not connected here), in its next ``AwaitServes``. The master answers what it was not
told was served: a node that stops pushing costs its consumers ``PUSH_TIMEOUT_S`` once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from time import perf_counter

from blizzard.net.transport import Endpoint
from blizzard.server.router import RouterServer
from blizzard.wire import protocol as p
from datanode.reads import read
from datanode.store import BlobStore

log = logging.getLogger(__name__)

ANSWER_S = 10.0  # an AwaitServes unanswered this long is sent again (the master answers in 5 s)
REFUSED_S = 1.0  # ... after a refusal (this node not registered yet; a master of before)
MAX_REPORTED = 500  # served and failed orders one AwaitServes reports, each: as many as a
# ``Serves`` holds (the master takes no more; the rest go with the next one)
# the time one ``Serves`` may take: orders left past it are reported failed, so the master
# answers them at once rather than after its timeout (master/consume/pushes.py: PUSH_TIMEOUT_S)
SERVE_BUDGET_S = 0.1


class Serving:
    """The parked ``AwaitServes`` and the orders carried out since the last one."""

    def __init__(self, node_id: str, store: BlobStore, router: RouterServer,
                 timed: Callable[[str, float], None] = lambda op, began: None) -> None:
        self.node_id = node_id
        self.store = store
        self.router = router
        self.timed = timed  # the node's request timings: (op, perf_counter when it began)
        self.rid: int | None = None  # the AwaitServes out
        self.sent_at = 0.0
        self.not_before = 0.0
        self.served: list[int] = []
        self.failed: list[int] = []

    def ask(self, master: Endpoint, now: float) -> None:
        """Park an ``AwaitServes`` at the master, unless one is out (and not overdue)."""
        if (self.rid is not None and now - self.sent_at < ANSWER_S) or now < self.not_before:
            return
        served, self.served = self.served[:MAX_REPORTED], self.served[MAX_REPORTED:]
        failed, self.failed = self.failed[:MAX_REPORTED], self.failed[MAX_REPORTED:]
        try:
            self.rid = master.send(p.AwaitServes(self.node_id, served, failed))
        except TimeoutError:  # the master's queue is full: its orders time out there
            self.rid = None
            return
        self.sent_at = now

    def collect(self, master: Endpoint, now: float) -> None:
        """Carry out the orders, if the master answered the ``AwaitServes``."""
        reply = master.take(self.rid) if self.rid is not None else None
        if reply is None:
            return
        self.rid = None
        if isinstance(reply, p.Serves):
            until = perf_counter() + SERVE_BUDGET_S
            for order in reply.orders:
                if perf_counter() < until:
                    self.serve(order)
                else:  # a slow disk or a big batch: the master answers the rest
                    self.failed.append(order.seq)
        else:  # not registered yet, or a master that gives no orders: ask again later
            log.debug("the master refused to give serve orders: %s", reply)
            self.not_before = now + REFUSED_S

    def serve(self, order: p.ServeOrder) -> None:
        """Answer one lease with its payloads; noted as served or failed for the master."""
        began = perf_counter()
        try:
            blobs = read(self.store, p.Get(order.ids, None), None, b"")
            sent = self.router.push(order.to, order.rid, p.Pushed(
                order.answer, order.mac, blobs.ids, blobs.blobs, blobs.crcs, blobs.missing))
        except Exception:  # a bad order or a store fault: the master answers it instead
            log.exception("cannot serve a lease of %d items", len(order.ids))
            sent = False
        (self.served if sent else self.failed).append(order.seq)
        self.timed("push", began)
