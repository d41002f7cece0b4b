"""Leases answered by a data node, payloads and all: one message fewer each way (issue 35).

A consumer that names the routing id of its connections to data nodes in its ``Lease``
(``push_to``) may get the answer from a data node holding the items instead of from the
master. The master hands the lease's ``Leased`` to that node as a ``ServeOrder``, in the reply
to the node's parked ``AwaitServes``; the node reads the payloads and sends ``Pushed`` to the
consumer's connection, which then sends no ``Get``. Payloads still never pass through the
master, and the reply still goes out only when a direct one would (after the pass's fsync
where the lease logged something). The master signs each answer with the consumer's secret
(``Lease.push_key``, ``blizzard/wire/push_signature.py``): the consumer takes a pushed answer
only under that signature, so no data node can make one up.

A push never leaves a lease unanswered: an order the node reports failed (the consumer has no
connection there, say), or does not report done within ``PUSH_TIMEOUT_S`` of being handed to
it (the node is slow or gone) or of being queued for it (it did not ask), is answered by the
master itself. A node that let an order time out gets none until it asks again. A consumer
may so get two answers to one lease, the same ``Leased`` both times: it takes the first.
Leases whose answer is large (``MAX_PUSHED_BYTES``) are answered by the master: a ``Pushed``
must stay well under a frame's limit with the payloads added.
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Callable
from typing import Any

from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument
from blizzard.wire.push_signature import KEY_BYTES, sign

PUSH_TIMEOUT_S = 0.25  # a data node's longest time to report an order done (liveness: < 1 s)
AWAIT_S = 5.0  # a parked ``AwaitServes`` is answered empty after this long (the node asks again)
# bytes of a consumer's routing id: ids ZeroMQ makes up are 5 bytes, so a lease cannot have
# its answer pushed to a connection whose id the consumer did not choose
PUSH_ID_BYTES = 16
MAX_WANTED = 20_000  # leases remembered as wanting a push (a parked one waits up to its wait_s)
MAX_OUT = 20_000  # orders not yet reported done, all nodes together (more: answered directly)
MAX_SERVES = 500  # orders in one ``Serves`` (a node reports as many in one ``AwaitServes``)
MAX_SERVES_BYTES = 8 * 1024 * 1024  # ... and their answers' bytes
MAX_PUSHED_BYTES = 1024 * 1024  # an answer larger than this is the master's to send


class Pushes:
    """Which leases want a push, the data nodes waiting for orders, the orders out."""

    def __init__(self, reply: Callable[[bytes, int, Any], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.reply = reply  # the router's: sends one reply now
        self.clock = clock
        self.wanted: collections.OrderedDict[tuple[bytes, int], tuple[bytes, bytes]] = \
            collections.OrderedDict()  # (consumer, request id) -> its push_to and push_key
        self.awaiting: dict[str, tuple[bytes, int, float]] = {}  # node -> its parked await
        self.listening: dict[str, float] = {}  # node -> when it last asked for orders
        self.queued: dict[str, list[tuple[p.ServeOrder, int]]] = {}  # (order, its bytes) not
        # handed to their node yet
        self.out: dict[int, tuple[str, bytes, int, p.Leased, float]] = {}  # seq -> (node,
        # consumer, its request id, the lease's answer, deadline); in deadline order
        # order numbers start anywhere: a new master's cannot be taken for an old one's
        self.seq = int.from_bytes(os.urandom(6), "big")
        self.pushed = 0  # orders the nodes reported done, and answered here instead (metrics)
        self.direct = 0

    # -- consumers ---------------------------------------------------------------------------

    def want(self, msg: p.Lease, peer: bytes, rid: int) -> None:
        """A lease arrived: remember where its answer may be pushed (checked first)."""
        if not msg.push_to:
            return
        if len(msg.push_to) != PUSH_ID_BYTES or len(msg.push_key) != KEY_BYTES:
            raise InvalidArgument(f"push_to is a routing id of {PUSH_ID_BYTES} bytes (the one "
                                  "this client gives its connections to data nodes), push_key "
                                  f"a secret of {KEY_BYTES}")
        if len(self.wanted) >= MAX_WANTED:
            self.wanted.popitem(last=False)  # the oldest: answered directly when its time comes
        self.wanted[peer, rid] = (msg.push_to, msg.push_key)

    def send(self, peer: bytes, rid: int, reply: Any) -> None:
        """Every reply to a request goes out here: the answer to a lease that wants a push,
        to a node that holds all its items and waits for orders; any other at once."""
        wanted = self.wanted.pop((peer, rid), None) if self.wanted else None
        node = self._node_for(reply) if wanted is not None else None
        if node is not None and len(self.out) < MAX_OUT:
            frame = p.encode(rid, reply)
            if len(frame) <= MAX_PUSHED_BYTES:
                assert wanted is not None
                to, key = wanted
                self.seq += 1
                order = p.ServeOrder(self.seq, to, rid, reply.ids, frame, sign(key, frame))
                self.queued.setdefault(node, []).append((order, len(frame)))
                self.out[self.seq] = (node, peer, rid, reply, self.clock() + PUSH_TIMEOUT_S)
                return
        self.reply(peer, rid, reply)

    def _node_for(self, reply: Any) -> str | None:
        """A node to answer this lease: it holds every item, is not suspected, waits for
        orders. None: the master answers."""
        if type(reply) is not p.Leased or not reply.ids or reply.lost:
            return None
        sets = set(reply.replica_set)
        if len(sets) != 1:
            return None
        suspects = reply.suspects
        for ref in reply.replica_sets[sets.pop()].nodes:
            if ref.node_id in self.listening and ref.node_id not in suspects:
                return ref.node_id
        return None

    # -- data nodes --------------------------------------------------------------------------

    def await_serves(self, msg: p.AwaitServes, peer: bytes, rid: int) -> p.Serves | None:
        """A data node reports its last orders and waits for more: orders queued for it now,
        or None (parked until some come, ``AWAIT_S`` at most)."""
        if len(msg.served) > MAX_SERVES or len(msg.failed) > MAX_SERVES:
            raise InvalidArgument(f"an AwaitServes reports at most {MAX_SERVES} orders served "
                                  "and as many failed")
        node = msg.node_id
        for seq in msg.served:
            if self._take(seq, node) is not None:
                self.pushed += 1
        for seq in msg.failed:
            self._answer(self._take(seq, node))
        self.listening[node] = self.clock()
        if self.queued.get(node):
            return p.Serves(self._hand_out(node))
        self.awaiting[node] = (peer, rid, self.clock() + AWAIT_S)
        return None

    def _take(self, seq: int, node: str) -> tuple[str, bytes, int, p.Leased, float] | None:
        """Order ``seq`` if it is ``node``'s and still out (a late report finds it gone)."""
        entry = self.out.get(seq)
        if entry is None or entry[0] != node:
            return None
        return self.out.pop(seq)

    def _answer(self, entry: tuple[str, bytes, int, p.Leased, float] | None,
                late: bool = False) -> None:
        """The master answers an order's lease itself; a ``late`` node is named a suspect in
        the answer, so the consumer's read asks it last (no hedge delay on it again)."""
        if entry is not None:
            node, peer, rid, leased, _ = entry
            if late and node not in leased.suspects:
                leased = p.replace(leased, suspects=[*leased.suspects, node])
            self.direct += 1
            self.reply(peer, rid, leased)

    def _hand_out(self, node: str) -> list[p.ServeOrder]:
        """The node's queued orders that fit one ``Serves``; each has ``PUSH_TIMEOUT_S`` from
        now (moved last in ``out``, which keeps it in deadline order)."""
        queued = self.queued.pop(node)
        given: list[p.ServeOrder] = []
        size = 0
        deadline = self.clock() + PUSH_TIMEOUT_S
        for k, (order, frame_bytes) in enumerate(queued):
            if given and (len(given) >= MAX_SERVES or size + frame_bytes > MAX_SERVES_BYTES):
                self.queued[node] = queued[k:]
                break
            given.append(order)
            size += frame_bytes
            entry = self.out.pop(order.seq, None)
            if entry is not None:
                self.out[order.seq] = (*entry[:4], deadline)
        return given

    def flush(self) -> None:
        """The orders this pass queued, to their nodes that wait (after the pass's replies)."""
        for node in [n for n in self.queued if n in self.awaiting]:
            peer, rid, _ = self.awaiting.pop(node)
            self.reply(peer, rid, p.Serves(self._hand_out(node)))

    # -- time --------------------------------------------------------------------------------

    def expire(self) -> None:
        """Orders overdue are answered here, and their nodes get no more until they ask
        again (one that asks meanwhile keeps its request); awaits parked ``AWAIT_S`` are
        answered empty."""
        now = self.clock()
        late_nodes = set()
        while self.out:
            seq, entry = next(iter(self.out.items()))
            if entry[4] > now:
                break
            del self.out[seq]
            late_nodes.add(entry[0])
            self._answer(entry, late=True)
        for node in late_nodes - self.awaiting.keys():
            self.listening.pop(node, None)
            for order, _ in self.queued.pop(node, []):
                self._answer(self.out.pop(order.seq, None), late=True)
        for node, (peer, rid, until) in list(self.awaiting.items()):
            if until <= now:
                del self.awaiting[node]
                self.reply(peer, rid, p.Serves([]))
        for node, seen in list(self.listening.items()):
            if node not in self.awaiting and now - seen > 2 * AWAIT_S:
                del self.listening[node]  # it stopped asking (gone, or an older version)

    def next_wake(self) -> float | None:
        """When ``expire`` has something to do (monotonic), None: nothing waits on time."""
        soon = [until for _, _, until in self.awaiting.values()]
        if self.out:
            soon.append(next(iter(self.out.values()))[4])  # the oldest is due first
        return min(soon) if soon else None
