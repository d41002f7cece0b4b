"""The client's side of the data path: connections to data nodes, puts, reads, nodes to avoid.

Payload bytes go between the client and data nodes only. A put goes to every node of a
placement, each of which reports it to the master; a read asks an item's replicas and checks
size and CRC-32 (P5: ``intact``, the one check every read makes).

Reads are hedged, so that no read waits on one node (docs/design.md, liveness): a ``Get`` not
answered within the node's hedge delay (about twice its recent p99, ``blizzard/net/hedge.py``)
goes to the item's next replica as well, and the first intact answer wins; the late one is
dropped unread (``Endpoint.forget``). Nodes are avoided for a while: one that failed or timed
out for ``SUSPECT_S``, one that was slow (hedged) for ``SLOW_S``; the master's suspects, named
in its placement and lease replies, until it says otherwise. Avoided nodes are asked last.

Puts carry their placement's grant, reads their lease's (a secure data node serves nothing
without one). A read a node refused as ``Forbidden`` tries the other replicas and, if none
serves it, fails with that error.

``read`` is the read with replica fail-over; ``read_from`` is one ``Get`` to one node, for a
reader that planned which node serves what (Spark's executors), with the same check, given up
after the hedge delay (the reader then falls back on ``read``).
"""

from __future__ import annotations

import logging
import os
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import zmq

from blizzard.client.message import LeasedItem
from blizzard.net.hedge import OWN_SAMPLES, HedgeDelays
from blizzard.net.keys import ClientKeys
from blizzard.net.transport import Endpoint, Replies
from blizzard.wire import protocol as p
from blizzard.wire import push_signature
from blizzard.wire.codec import as_ids
from blizzard.wire.errors import (
    AuthenticationFailed,
    BlizzardError,
    ClientClosed,
    DataCorrupt,
    DatanodeUnavailable,
    Forbidden,
)

log = logging.getLogger("blizzard.client.core")

SUSPECT_S = 10.0  # a data node that just failed us is avoided this long
SLOW_S = 5.0  # ... and one that was slow to answer a read (it was hedged), this long


def intact(blob: bytes | None, size: int, crc: int) -> bool:
    """Whether a payload read is the one stored: its size and CRC-32 match (P5: a bad copy is
    never served)."""
    return blob is not None and len(blob) == size and zlib.crc32(blob) == crc


@dataclass
class NodeRead:
    """What ``DatanodePool.read_from`` got: the intact payloads by id, the positions (in the
    ids asked) of the items not brought back intact, and whether the node refused the grant."""

    payloads: dict[int, bytes]
    rest: list[int]
    forbidden: bool = False  # renew the grant and ask again


@dataclass(eq=False)
class _Ask:
    """One ``Get`` in flight: to which node, for which (item, replica index) pairs."""

    ep: Endpoint
    rid: int
    node_id: str
    items: list[tuple[LeasedItem, int]]
    sent: float
    hedge_at: float  # past this, the items go to their next replicas too
    until: float  # past this, the node counts as failed
    hedged: bool = False


@dataclass
class Reads:
    """What ``DatanodePool.read`` found: payloads by id, items no replica served, bad replicas."""

    payloads: dict[int, bytes]
    failed: list[LeasedItem]
    bad: list[tuple[int, str]]  # (item id, node id) of replicas that answered without it
    forbidden: str = ""  # why a data node refused a read's grant, if one did

    def corrupt(self) -> list[LeasedItem]:
        """Failed items every replica of which answered, none with a good copy.

        Their data is damaged or gone (P5: a bad copy is never served): asking again will not
        help. A failed item with a replica that did not answer may still be read later.
        """
        bad_on: dict[int, set[str]] = defaultdict(set)
        for item_id, node_id in self.bad:
            bad_on[item_id].add(node_id)
        return [item for item in self.failed
                if item.nodes and all(n.node_id in bad_on[item.id] for n in item.nodes)]

    def unreadable(self) -> BlizzardError:
        """The error for a read that got none of its payloads: ``Forbidden`` if a node refused
        the grant, ``DataCorrupt`` if every failed item is corrupt (see ``corrupt``), else
        ``DatanodeUnavailable``."""
        ids = [item.id for item in self.failed][:5]
        if self.forbidden:
            return Forbidden(f"data nodes refused to serve items {ids}: {self.forbidden}")
        if len(self.corrupt()) == len(self.failed):
            return DataCorrupt(f"every replica of items {ids} failed its checksum or is missing")
        return DatanodeUnavailable(f"no replica of items {ids} could be read")


class DatanodePool:
    """Connections to data nodes (opened on first use) and the nodes this client avoids."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], *, node_timeout_s: float,
                 keys: ClientKeys | None = None,
                 node_key: Callable[[], bytes | None] = lambda: None) -> None:
        self.ctx = ctx
        self.keys = keys
        self.node_key = node_key  # the data nodes' public key, looked up on first use
        self.node_timeout_s = node_timeout_s
        self.endpoints: dict[str, Endpoint] = {}
        self._suspects: dict[str, float] = {}  # node id -> monotonic time it is trusted again
        self.told: frozenset[str] = frozenset()  # the master's suspects, from its last reply
        self.delays = HedgeDelays(warmup=OWN_SAMPLES)  # (see delay_s)
        self.gets = 0  # Gets sent, and how many of them were hedges (a read's second ask)
        self.hedges = 0
        self.closed = False
        # the routing id of every connection to a data node: a lease naming it (``push_to``)
        # may be answered by a node, payloads and all (``master/consume/pushes.py``); the payloads
        # of the last such answer wait here for ``read``
        self.routing_id = os.urandom(16)  # master/consume/pushes.py: PUSH_ID_BYTES
        # the secret the master signs pushed answers with (blizzard/wire/push_signature.py)
        self.push_key = os.urandom(push_signature.KEY_BYTES)
        self.pushed: dict[int, bytes] = {}
        self._opened: tuple[Any, Any] | None = None  # the last genuine push, and its answer
        self.pushes = 0  # leases answered by a data node

    def endpoint(self, addr: str) -> Endpoint:
        ep = self.endpoints.get(addr)
        if ep is None:
            if self.closed:
                raise ClientClosed()
            ep = self.endpoints[addr] = Endpoint(self.ctx, addr, self.keys,
                                                 self.node_key() if self.keys else None,
                                                 self.routing_id)
        return ep

    def connected(self) -> list[Endpoint]:
        """The connections open to data nodes: where a pushed answer may come."""
        return [ep for ep in self.endpoints.values() if ep.sock is not None]

    def genuine(self, rid: int, reply: Any) -> bool:
        """Whether ``reply``, come on a data-node connection as the answer to request ``rid``,
        is one the master gave: a ``Pushed`` whose answer is signed with this pool's
        ``push_key`` and is a ``Leased`` for that request."""
        if not isinstance(reply, p.Pushed):
            return False
        leased = push_signature.opened(self.push_key, rid, reply.answer, reply.mac)
        if not isinstance(leased, p.Leased):
            return False
        self._opened = (reply, leased)  # decoded once: ``take_pushed`` takes it from here
        return True

    def take_pushed(self, reply: Any) -> Any:
        """A lease's answer as the master's ``Leased``: one a data node sent (``Pushed``,
        ``genuine`` already) leaves its payloads for the next ``read`` (checked there, as
        read ones are)."""
        if not isinstance(reply, p.Pushed):
            self.pushed = {}
            return reply
        self.pushes += 1
        self.pushed = dict(zip(reply.ids, reply.blobs, strict=True))
        opened, self._opened = self._opened, None
        if opened is not None and opened[0] is reply:
            return opened[1]
        return p.decode(reply.answer)[1]

    def close(self) -> None:
        for ep in self.endpoints.values():
            ep.close()
        self.endpoints.clear()
        self.closed = True

    # -- nodes to avoid ----------------------------------------------------------------------

    def suspect(self, node_ids: Iterable[str], for_s: float = SUSPECT_S) -> None:
        """Avoid these data nodes for ``for_s``: they failed a put or a read just now (or were
        slow to answer one), and the master may not know it yet."""
        until = time.monotonic() + for_s
        for node_id in node_ids:
            self._suspects[node_id] = max(until, self._suspects.get(node_id, 0.0))

    def heard(self, suspects: Iterable[str]) -> None:
        """The master's suspect (and lately dead) nodes, from a placement or lease reply: its view
        replaces the last one it gave."""
        self.told = frozenset(suspects)

    def own_suspects(self) -> list[str]:
        """The nodes this client itself found failing or slow (``suspect``), still avoided."""
        if self._suspects:
            now = time.monotonic()
            self._suspects = {n: t for n, t in self._suspects.items() if t > now}
        return sorted(self._suspects)

    def suspected(self) -> list[str]:
        """Data nodes asked last for now: this client's own suspects and the master's."""
        return sorted(self.told.union(self.own_suspects()))

    # -- puts --------------------------------------------------------------------------------

    def put_reported(self, nodes: Sequence[p.NodeRef], grant: p.PutGrant | None, ids: list[int],
                     blobs: list[bytes], crcs: list[int], meta: p.ItemMeta) -> list[str]:
        """Send the payloads to every node named, each to report to the master, not to us;
        each keeps ``meta`` (every id's) beside the blobs, for a rebuild of the master.

        Returns the node ids the put could not even be sent to (a full send queue).
        """
        failed = []
        for ref in nodes:
            try:
                self.endpoint(ref.addr).send(p.Put(as_ids(ids), blobs, crcs, [], 1, ref.node_id,
                                                   True, grant, [meta]))
            except TimeoutError:
                failed.append(ref.node_id)
        return failed

    # -- reads -------------------------------------------------------------------------------

    def read_from(self, node: p.NodeRef, ids: Sequence[int], sizes: Sequence[int],
                  crcs: Sequence[int], grant: p.GetGrant | None) -> NodeRead:
        """One ``Get`` of ``ids`` from ``node``, each payload checked (``intact``). A node that
        does not answer within its hedge delay is avoided for a while (``SLOW_S``) and nothing
        it should have sent is trusted: the caller reads the rest from the other replicas."""
        ep = self.endpoint(node.addr)
        sent = time.monotonic()
        wait_s = min(self.node_timeout_s, self.delays.delay_s(node.node_id, sum(sizes)))
        self.gets += 1
        try:
            rid = ep.send(p.Get(as_ids(list(ids)), grant))
        except TimeoutError:
            reply: Any = TimeoutError(f"cannot send to {node.addr}")
        else:
            reply = None
            while reply is None and time.monotonic() < sent + wait_s:
                left_ms = int((sent + wait_s - time.monotonic()) * 1000)
                if ep.has(rid) or ep.wait(max(left_ms, 1)):
                    ep.read_ready(rid)
                reply = ep.take(rid) or ep.refused
            if reply is None:
                ep.forget(rid)
                reply = TimeoutError(f"no reply from {node.addr} within {wait_s:.3f}s")
        if not isinstance(reply, p.Blobs):
            if isinstance(reply, TimeoutError):
                log.info("data node %s is slow or down; reading from other replicas", node.addr)
                self.suspect([node.node_id], SLOW_S)
            forbidden = isinstance(reply, p.Error) and reply.code == Forbidden.code
            return NodeRead({}, list(range(len(ids))), forbidden)
        self.delays.observe(node.node_id, time.monotonic() - sent)
        got: dict[int, bytes] = dict(zip(reply.ids, reply.blobs, strict=True))
        rest = []
        for k, item_id in enumerate(ids):
            if not intact(got.get(item_id), sizes[k], crcs[k]):
                got.pop(item_id, None)
                rest.append(k)
        return NodeRead(got, rest)

    def read(self, items: list[LeasedItem]) -> Reads:
        """Read payloads, each item from its replicas, hedged (see the module docstring);
        verify size and checksum (P5). Those a data node pushed with the lease are taken as
        they are, if intact; only the rest are asked for."""
        pushed, self.pushed = self.pushed, {}
        if not pushed:
            return _HedgedRead(self, items).run()
        have = {i.id: blob for i in items
                if (blob := pushed.get(i.id)) is not None and intact(blob, i.size, i.crc)}
        rest = [i for i in items if i.id not in have]
        if not rest:
            return Reads(have, [], [])
        reads = _HedgedRead(self, rest).run()
        reads.payloads.update(have)
        return reads


class _HedgedRead:
    """One ``DatanodePool.read``: Gets in flight, hedged past their node's delay, until every
    item is read intact or has no replica left to ask."""

    def __init__(self, pool: DatanodePool, items: list[LeasedItem]) -> None:
        self.pool = pool
        avoid = set(pool.suspected())
        if avoid:  # replicas not avoided first (the list is the master's: healthy nodes first)
            items = [replace(i, nodes=sorted(i.nodes, key=lambda n: n.node_id in avoid))
                     for i in items]
        self.items = items
        self.got: dict[int, bytes] = {}
        self.failed: list[LeasedItem] = []
        self.bad: list[tuple[int, str]] = []
        self.forbidden = ""
        self.next = dict.fromkeys((i.id for i in items), 0)  # id -> next replica to ask
        self.asked = dict.fromkeys((i.id for i in items), 0)  # id -> Gets in flight for it
        self.done: set[int] = set()
        self.asks: list[_Ask] = []

    def run(self) -> Reads:
        self._ask([pair for item in self.items if (pair := self._next(item)) is not None])
        try:
            while self.asks and len(self.done) < len(self.items):
                self._wait()
                now = time.monotonic()
                again: list[tuple[LeasedItem, int]] = []
                for ask in list(self.asks):
                    reply = ask.ep.take(ask.rid) or ask.ep.refused
                    if reply is not None:
                        self.asks.remove(ask)
                        again += self._answered(ask, reply, now)
                    elif now >= ask.until:
                        self.asks.remove(ask)
                        ask.ep.forget(ask.rid)
                        again += self._failed(ask, TimeoutError(
                            f"no reply from {ask.ep.addr} within {self.pool.node_timeout_s:g}s"))
                    elif not ask.hedged and now >= ask.hedge_at:
                        ask.hedged = True
                        self.pool.hedges += 1
                        self.pool.suspect([ask.node_id], SLOW_S)
                        again += [pair for item, _ in ask.items if item.id not in self.done
                                  and (pair := self._next(item)) is not None]
                if again:
                    self._ask(again)
        finally:
            for ask in self.asks:  # answered elsewhere: their replies are dropped on arrival
                ask.ep.forget(ask.rid)
        return Reads(self.got, self.failed, self.bad, self.forbidden)

    def _next(self, item: LeasedItem) -> tuple[LeasedItem, int] | None:
        """The item's next replica to ask; None if none is left (then, with no Get in flight
        for it either, the item has failed)."""
        nodes, k = item.nodes, self.next[item.id]
        while k < len(nodes) and not nodes[k].addr:
            k += 1
        if k < len(nodes):
            self.next[item.id] = k + 1
            return item, k
        self.next[item.id] = k
        if not self.asked[item.id] and item.id not in self.done:
            self.done.add(item.id)
            self.failed.append(item)
        return None

    def _ask(self, pairs: list[tuple[LeasedItem, int]]) -> None:
        """One Get per node and grant (items of one lease share theirs)."""
        by_addr: dict[tuple[str, bytes], list[tuple[LeasedItem, int]]] = defaultdict(list)
        for item, k in pairs:
            mac = item.grant.mac if item.grant is not None else b""
            by_addr[item.nodes[k].addr, mac].append((item, k))
        pool = self.pool
        for (addr, _), group in by_addr.items():
            node_id = group[0][0].nodes[group[0][1]].node_id
            for item, _ in group:
                self.asked[item.id] += 1
            ep = pool.endpoint(addr)
            now = time.monotonic()
            ask = _Ask(ep, 0, node_id, group, now,
                       now + pool.delays.delay_s(node_id, sum(i.size for i, _ in group)),
                       now + pool.node_timeout_s)
            pool.gets += 1
            try:
                ask.rid = ep.send(p.Get(as_ids([i.id for i, _ in group]), group[0][0].grant))
            except TimeoutError as exc:
                self._ask(self._failed(ask, exc))
                continue
            self.asks.append(ask)

    def _wait(self) -> None:
        """Until a reply arrives, or the next ask is due a hedge or its timeout."""
        if any(a.ep.has(a.rid) for a in self.asks):
            return
        due = min(a.until if a.hedged else a.hedge_at for a in self.asks)
        Replies({a.ep for a in self.asks}).read(max(1, int((due - time.monotonic()) * 1000)),
                                                self.asks[0].rid if len(self.asks) == 1 else 0)

    def _answered(self, ask: _Ask, reply: Any, now: float) -> list[tuple[LeasedItem, int]]:
        if not isinstance(reply, p.Blobs):
            return self._failed(ask, reply)
        self.pool.delays.observe(ask.node_id, now - ask.sent)
        got: dict[int, bytes] = dict(zip(reply.ids, reply.blobs, strict=True))
        # a reply is capped by bytes: ids in neither list were not reached, ask again
        unreached = {i.id for i, _ in ask.items} - set(reply.ids) - set(reply.missing) \
            if reply.ids else set()
        again = []
        for item, k in ask.items:
            self.asked[item.id] -= 1
            if item.id in self.done:
                continue
            if item.id in unreached:  # asked again, of the same replica
                again.append((item, k))
                continue
            blob = got.get(item.id)
            if blob is not None and intact(blob, item.size, item.crc):
                self.got[item.id] = blob
                self.done.add(item.id)
                continue
            if blob is not None:
                log.error("replica of item %d on %s fails its checksum", item.id, ask.ep.addr)
            self.bad.append((item.id, item.nodes[k].node_id))
            if (pair := self._next(item)) is not None:
                again.append(pair)
        return again

    def _failed(self, ask: _Ask, reply: Any) -> list[tuple[LeasedItem, int]]:
        """The ask got no answer (a timeout, a refusal, an error): its items go on to their
        next replicas."""
        log.warning("read from %s failed: %s", ask.ep.addr, reply)
        if isinstance(reply, (TimeoutError, AuthenticationFailed)):
            self.pool.suspect([ask.node_id])
        if isinstance(reply, AuthenticationFailed) or \
                (isinstance(reply, p.Error) and reply.code == Forbidden.code):
            self.forbidden = str(reply) if isinstance(reply, AuthenticationFailed) \
                else reply.message
        again = []
        for item, _ in ask.items:
            self.asked[item.id] -= 1
            if item.id not in self.done and (pair := self._next(item)) is not None:
                again.append(pair)
        return again
