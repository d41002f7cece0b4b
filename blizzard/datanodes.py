"""The client's side of the data path: connections to data nodes, puts, reads, nodes to avoid.

Payload bytes go between the client and data nodes only. A put goes to the first node of a
placement, which forwards to the other replicas; a read tries an item's replicas in turn and
checks size and CRC-32 (P5). A data node that fails a put or times out on a read is avoided
for ``SUSPECT_S``: the master declares a node dead only after its ``dead_after_s`` and until
then still places items there and lists it first among replicas.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable

import zmq

from blizzard import protocol as p
from blizzard.errors import (BlizzardError, ClusterError, DataCorrupt, DatanodeUnavailable,
                             NotEnoughDatanodes)
from blizzard.message import LeasedItem
from blizzard.transport import Endpoint, call_many, raise_if_error

log = logging.getLogger("blizzard.client")

SUSPECT_S = 10.0  # a data node that just failed us is avoided this long


@dataclass(frozen=True)
class PutFailed:
    """A put that did not reach ``min_copies``: the error, and the nodes to avoid next time."""

    error: BlizzardError
    avoid: list[str]


@dataclass
class Reads:
    """What ``DatanodePool.read`` found: payloads by id, items no replica served, bad replicas."""

    payloads: dict[int, bytes]
    failed: list[LeasedItem]
    bad: list[tuple[int, str]]  # (item id, node id) of replicas that answered without it

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

    def unreadable(self) -> ClusterError:
        """The error for a read that got none of its payloads: ``DataCorrupt`` if every failed
        item is corrupt (see ``corrupt``), else ``DatanodeUnavailable``."""
        ids = [item.id for item in self.failed][:5]
        if len(self.corrupt()) == len(self.failed):
            return DataCorrupt(f"every replica of items {ids} failed its checksum or is missing")
        return DatanodeUnavailable(f"no replica of items {ids} could be read")


class DatanodePool:
    """Connections to data nodes (opened on first use) and the nodes this client avoids."""

    def __init__(self, ctx: zmq.Context, *, node_timeout_s: float) -> None:
        self.ctx = ctx
        self.node_timeout_s = node_timeout_s
        self.endpoints: dict[str, Endpoint] = {}
        self._suspects: dict[str, float] = {}  # node id -> monotonic time it is trusted again

    def endpoint(self, addr: str) -> Endpoint:
        ep = self.endpoints.get(addr)
        if ep is None:
            ep = self.endpoints[addr] = Endpoint(self.ctx, addr)
        return ep

    def close(self) -> None:
        for ep in self.endpoints.values():
            ep.close()
        self.endpoints.clear()

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

    def put_request(self, pl: p.Placement, blobs: list[bytes],
                    crcs: list[int]) -> tuple[Endpoint, p.Put]:
        """Where to send a chunk's put and what: the placement's first node forwards to the rest."""
        first, rest = pl.nodes[0], pl.nodes[1:]
        return self.endpoint(first.addr), p.Put(pl.ids, blobs, crcs, list(rest), pl.min_copies,
                                                first.node_id)

    @staticmethod
    def put_outcome(pl: p.Placement, reply: Any) -> p.Stored | PutFailed:
        """A put's reply (or ``TimeoutError``) as ``Stored`` with enough copies, or ``PutFailed``."""
        placed = [n.node_id for n in pl.nodes]
        if isinstance(reply, p.Stored):
            if len(reply.nodes) >= pl.min_copies:
                return reply
            return PutFailed(NotEnoughDatanodes(f"only {len(reply.nodes)} of {pl.min_copies} "
                                                "replicas stored the items"),
                             [n for n in placed if n not in reply.nodes])
        if isinstance(reply, TimeoutError):
            return PutFailed(DatanodeUnavailable(str(reply)), placed[:1])
        try:
            raise_if_error(reply)
        except ClusterError as exc:  # that node's trouble: try others
            return PutFailed(exc, placed[:1])
        return PutFailed(DatanodeUnavailable(f"unexpected reply {p.op_name(reply)}"), placed[:1])

    def put_all(self, placements: list[p.Placement], chunks: list[list[bytes]],
                crcs: list[list[int]]) -> list[p.Stored | PutFailed]:
        """Store each chunk on its placement, all at once; the outcome per chunk."""
        calls = [self.put_request(pl, chunk, c) for pl, chunk, c in zip(placements, chunks, crcs)]
        return [self.put_outcome(pl, reply)
                for pl, reply in zip(placements, call_many(calls, self.node_timeout_s))]

    # -- reads -------------------------------------------------------------------------------

    def read(self, items: list[LeasedItem]) -> Reads:
        """Read payloads, trying each item's replicas in turn; verify size and checksum (P5)."""
        got: dict[int, bytes] = {}
        failed: list[LeasedItem] = []
        bad: list[tuple[int, str]] = []
        avoid = set(self.suspected())
        if avoid:  # replicas not suspected first (the list is the master's: live nodes first)
            items = [dataclasses.replace(i, nodes=sorted(i.nodes, key=lambda n: n.node_id in avoid))
                     for i in items]
        todo = [(item, 0) for item in items]  # (item, index of the replica to try)
        while todo:
            by_addr: dict[str, list[tuple[LeasedItem, int]]] = defaultdict(list)
            for item, k in todo:
                nodes = item.nodes
                while k < len(nodes) and not nodes[k].addr:
                    k += 1
                if k < len(nodes):
                    by_addr[nodes[k].addr].append((item, k))
                else:
                    failed.append(item)
            calls = [(self.endpoint(a), p.Get([i.id for i, _ in group]))
                     for a, group in by_addr.items()]
            todo = []
            for (addr, group), reply in zip(by_addr.items(), call_many(calls, self.node_timeout_s)):
                answered = isinstance(reply, p.Blobs)
                unreached: set[int] = set()
                if answered:
                    got.update(zip(reply.ids, reply.blobs))
                    if reply.ids:  # a reply is capped by bytes: ids in neither list, ask again
                        unreached = {item.id for item, _ in group} - set(reply.ids) - \
                            set(reply.missing)
                else:
                    log.warning("read from %s failed: %s", addr, reply)
                    if isinstance(reply, TimeoutError):
                        self.suspect({item.nodes[k].node_id for item, k in group})
                crc32 = zlib.crc32
                for item, k in group:
                    if item.id in unreached:
                        todo.append((item, k))
                        continue
                    blob = got.get(item.id)
                    if blob is not None and (len(blob) == item.size and crc32(blob) == item.crc):
                        continue
                    if blob is not None:
                        log.error("replica of item %d on %s fails its checksum", item.id, addr)
                        del got[item.id]
                    todo.append((item, k + 1))
                    if answered:
                        bad.append((item.id, item.nodes[k].node_id))
        return Reads(got, failed, bad)
