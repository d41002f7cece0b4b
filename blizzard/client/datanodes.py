"""The client's side of the data path: connections to data nodes, puts, reads, nodes to avoid.

Payload bytes go between the client and data nodes only. A put goes to every node of a
placement, each of which reports it to the master; a read tries an item's replicas in turn and
checks size and CRC-32 (P5: ``intact``, the one check every read makes). A data node that fails a put or times out on a read is avoided
for ``SUSPECT_S``: the master declares a node dead only after its ``dead_after_s`` and until
then still places items there and lists it first among replicas.

Puts carry their placement's grant, reads their lease's (a secure data node serves nothing
without one). A read a node refused as ``Forbidden`` tries the other replicas and, if none
serves it, fails with that error.

``read`` is the read with replica fail-over; ``read_from`` is one ``Get`` to one node, for a
reader that planned which node serves what (Spark's executors), with the same check.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import zmq

from blizzard.client.message import LeasedItem
from blizzard.net.keys import ClientKeys
from blizzard.net.transport import Endpoint, call_many
from blizzard.wire import protocol as p
from blizzard.wire.codec import as_ids
from blizzard.wire.errors import (AuthenticationFailed, BlizzardError, ClientClosed, DataCorrupt,
                                  DatanodeUnavailable, Forbidden)

log = logging.getLogger("blizzard.client.core")

SUSPECT_S = 10.0  # a data node that just failed us is avoided this long


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
        self.closed = False

    def endpoint(self, addr: str) -> Endpoint:
        ep = self.endpoints.get(addr)
        if ep is None:
            if self.closed:
                raise ClientClosed()
            ep = self.endpoints[addr] = Endpoint(self.ctx, addr, self.keys,
                                                 self.node_key() if self.keys else None)
        return ep

    def close(self) -> None:
        for ep in self.endpoints.values():
            ep.close()
        self.endpoints.clear()
        self.closed = True

    # -- nodes to avoid ----------------------------------------------------------------------

    def suspect(self, node_ids: Iterable[str]) -> None:
        """Avoid these data nodes for a while: they failed a put or a read just now.

        The master declares a node dead only after ``dead_after_s``; until then it still
        places items there, and every call would wait out ``node_timeout_s`` on it again.
        """
        until = time.monotonic() + SUSPECT_S
        for node_id in node_ids:
            self._suspects[node_id] = until

    def suspected(self) -> list[str]:
        """Data nodes avoided for now (see ``suspect``)."""
        if not self._suspects:
            return []
        now = time.monotonic()
        self._suspects = {n: t for n, t in self._suspects.items() if t > now}
        return sorted(self._suspects)

    # -- puts --------------------------------------------------------------------------------

    def put_reported(self, pl: p.Placement, ids: list[int], blobs: list[bytes],
                     crcs: list[int], meta: p.ItemMeta) -> list[str]:
        """Send the payloads to every placed node, each to report to the master, not to us;
        each keeps ``meta`` (every id's) beside the blobs, for a rebuild of the master.

        Returns the node ids the put could not even be sent to (a full send queue).
        """
        failed = []
        for ref in pl.nodes:
            try:
                self.endpoint(ref.addr).send(p.Put(as_ids(ids), blobs, crcs, [], 1, ref.node_id,
                                                   True, pl.grant, [meta]))
            except TimeoutError:
                failed.append(ref.node_id)
        return failed

    # -- reads -------------------------------------------------------------------------------

    def read_from(self, node: p.NodeRef, ids: Sequence[int], sizes: Sequence[int],
                  crcs: Sequence[int], grant: p.GetGrant | None) -> NodeRead:
        """One ``Get`` of ``ids`` from ``node``, each payload checked (``intact``); a node that
        timed out is suspected (``suspect``), and nothing it should have sent is trusted."""
        reply = call_many([(self.endpoint(node.addr), p.Get(as_ids(list(ids)), grant))],
                          self.node_timeout_s)[0]
        if not isinstance(reply, p.Blobs):
            if isinstance(reply, TimeoutError):
                log.warning("data node %s is slow or down; reading from other replicas",
                            node.addr)
                self.suspect([node.node_id])
            forbidden = isinstance(reply, p.Error) and reply.code == Forbidden.code
            return NodeRead({}, list(range(len(ids))), forbidden)
        got: dict[int, bytes] = dict(zip(reply.ids, reply.blobs))
        rest = []
        for k, item_id in enumerate(ids):
            if not intact(got.get(item_id), sizes[k], crcs[k]):
                got.pop(item_id, None)
                rest.append(k)
        return NodeRead(got, rest)

    def read(self, items: list[LeasedItem]) -> Reads:
        """Read payloads, trying each item's replicas in turn; verify size and checksum (P5)."""
        got: dict[int, bytes] = {}
        failed: list[LeasedItem] = []
        bad: list[tuple[int, str]] = []
        forbidden = ""
        avoid = set(self.suspected())
        if avoid:  # replicas not suspected first (the list is the master's: live nodes first)
            items = [dataclasses.replace(i, nodes=sorted(i.nodes, key=lambda n: n.node_id in avoid))
                     for i in items]
        todo = [(item, 0) for item in items]  # (item, index of the replica to try)
        while todo:
            # one Get per node and grant (items of one lease share theirs): (addr, MAC) -> items
            by_addr: dict[tuple[str, bytes], list[tuple[LeasedItem, int]]] = defaultdict(list)
            for item, k in todo:
                nodes = item.nodes
                while k < len(nodes) and not nodes[k].addr:
                    k += 1
                if k < len(nodes):
                    mac = item.grant.mac if item.grant is not None else b""
                    by_addr[nodes[k].addr, mac].append((item, k))
                else:
                    failed.append(item)
            calls = [(self.endpoint(a), p.Get(as_ids([i.id for i, _ in group]), group[0][0].grant))
                     for (a, _), group in by_addr.items()]
            todo = []
            for ((addr, _), group), reply in zip(by_addr.items(),
                                                 call_many(calls, self.node_timeout_s)):
                answered = isinstance(reply, p.Blobs)
                unreached: set[int] = set()
                if answered:
                    got.update(zip(reply.ids, reply.blobs))
                    if reply.ids:  # a reply is capped by bytes: ids in neither list, ask again
                        unreached = {item.id for item, _ in group} - set(reply.ids) - \
                            set(reply.missing)
                else:
                    log.warning("read from %s failed: %s", addr, reply)
                    if isinstance(reply, (TimeoutError, AuthenticationFailed)):
                        self.suspect({item.nodes[k].node_id for item, k in group})
                    if isinstance(reply, AuthenticationFailed) or \
                            (isinstance(reply, p.Error) and reply.code == Forbidden.code):
                        forbidden = str(reply) if isinstance(reply, AuthenticationFailed) \
                            else reply.message
                for item, k in group:
                    if item.id in unreached:
                        todo.append((item, k))
                        continue
                    blob = got.get(item.id)
                    if intact(blob, item.size, item.crc):
                        continue
                    if blob is not None:
                        log.error("replica of item %d on %s fails its checksum", item.id, addr)
                        del got[item.id]
                    todo.append((item, k + 1))
                    if answered:
                        bad.append((item.id, item.nodes[k].node_id))
        return Reads(got, failed, bad, forbidden)
