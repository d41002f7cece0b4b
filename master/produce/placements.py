"""Ids handed out ahead of their enqueue, and which data nodes reported their payloads stored.

A producer asks for a block of ids with a placement (``Place``) and may hold it for up to
``pending_timeout_s``: a one-item ``enqueue`` takes the next id of its block, so it needs no
round trip to the master before the payload goes out. The producer sends the payload to
every placed node (``Put`` with ``report``) and, at the same time, its ``Enqueue`` to the
master; each node tells the master what it stored (``PutReport``, once per loop pass), and
the enqueue completes when W (``min_replicas``) nodes have reported every id (``Enqueues``).

This table is memory only, like pending enqueues: a restart forgets it, the producer's
``Enqueue`` is then refused as unknown and done again under fresh ids. A block that expires
orders its stored but never enqueued blobs deleted; a report of an id no block holds (the
master restarted, or the block expired) orders that blob deleted at once.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument, MasterStarting, NotEnoughDatanodes, TooManyItems
from master.config import MasterConfig
from master.nodes.blob_deletes import Deletes
from master.nodes.grant_keys import CapabilityKeys
from master.nodes.membership import Membership
from master.nodes.safe_mode import SafeMode
from master.produce.ids import ItemIds
from master.rules import arguments

MAX_HELD = 1_000_000  # ids handed out and not yet enqueued, all producers together
MAX_HELD_PER_PEER = 200_000  # ... one connection's share


@dataclass(slots=True, eq=False)
class Block:
    """Ids ``first .. first + n - 1``, placed on ``nodes``, held by the connection ``peer``."""

    first: int
    n: int
    nodes: tuple[str, ...]
    peer: bytes
    left: int  # ids neither enqueued nor dropped yet


class Blocks:
    """Place requests, put reports, and the ids between them."""

    def __init__(self, config: MasterConfig, ids: ItemIds, membership: Membership,
                 safe_mode: SafeMode, deletes: Deletes, capabilities: CapabilityKeys,
                 kept_on: Callable[[int], tuple[str, ...] | None]) -> None:
        self.config = config
        self.ids = ids
        self.membership = membership
        self.safe_mode = safe_mode
        self.deletes = deletes
        self.capabilities = capabilities
        self.kept_on = kept_on  # where the master keeps an enqueued or staged id (None: nowhere)
        self.by_id: dict[int, Block] = {}
        self.stored: dict[int, list[str]] = {}  # id -> nodes that reported its payload durable
        self.refused: dict[int, dict[str, str]] = {}  # id -> {node: why} for nodes that refused it
        self.expiry: list[tuple[float, int, Block]] = []
        self.by_peer: dict[bytes, int] = {}
        self.touched: set[int] = set()  # ids with news since ``take_news``

    def holds(self, item_id: int) -> bool:
        return item_id in self.by_id

    # -- place -------------------------------------------------------------------------------

    def place(self, msg: p.Place, now: float, mono: float, peer: bytes, rid: int) -> p.Placement:
        arguments.batch(msg.n, "ids")
        arguments.node_ids(msg.exclude, "exclude")
        n = msg.n
        if len(self.by_id) + n > MAX_HELD:
            raise TooManyItems(f"{len(self.by_id)} ids are handed out and not enqueued; the "
                               f"master holds at most {MAX_HELD} (enqueue or retry later)")
        if self.by_peer.get(peer, 0) + n > MAX_HELD_PER_PEER:
            raise TooManyItems(f"this connection holds {self.by_peer[peer]} ids not enqueued; "
                               f"at most {MAX_HELD_PER_PEER}")
        nodes = self.membership.place(self.config.replication, set(msg.exclude), mono)
        min_replicas = self.config.quorum
        if len(nodes) < min_replicas and self.safe_mode.on:
            raise MasterStarting("the master is starting and waits for data nodes to report")
        if len(nodes) < min_replicas:
            raise NotEnoughDatanodes(f"{len(nodes)} live data nodes can take the write; "
                                     f"{min_replicas} needed")
        first = self.ids.take(n)
        block = Block(first, n, tuple(node.node_id for node in nodes), peer, n)
        self.by_id.update(dict.fromkeys(range(first, first + n), block))
        self.by_peer[peer] = self.by_peer.get(peer, 0) + n
        deadline_s = self.config.pending_timeout_s
        heapq.heappush(self.expiry, (mono + deadline_s, first, block))
        grant = self.capabilities.put_grant(first, n, list(block.nodes), now + deadline_s)
        return p.Placement(first, n, [p.NodeRef(node.node_id, node.addr) for node in nodes],
                           min_replicas, deadline_s, grant, self.membership.suspects(mono))

    # -- hedging a write -----------------------------------------------------------------------

    def hedge(self, ids: list[int], now: float, mono: float) -> p.PutAlso | None:
        """More nodes for ``ids``, whose placed nodes have not all reported them in time.

        For as many copies as the worst-off id still lacks, healthy live nodes outside the
        placement join it (their reports count from now on); the reply names the nodes that
        have not reported (``slow``: the client avoids them for a while, the master does not:
        a client could name any node so). None when the ids are not all of one block (no client
        sends such an enqueue), the block already spans twice R nodes (a client that puts
        nowhere must not spread its ids over the whole cluster), none of the placed nodes
        reported any id yet (then the hold-up is not one node's), or no healthy spare is left:
        the write waits for its placed nodes meanwhile, and the master asks again later.
        """
        block = self.by_id.get(ids[0]) if ids else None
        if block is None or any(self.by_id.get(i) is not block for i in ids):
            return None
        need = self.config.quorum
        lacking = max(need - len(self.holders(i)) for i in ids)
        room = 2 * self.config.replication - len(block.nodes)
        if lacking <= 0 or room <= 0 or not any(self.holders(i) for i in ids):
            return None
        spares = self.membership.spares(min(lacking, room), set(block.nodes), mono)
        if not spares:
            return None
        slow = sorted({n for i in ids for n in block.nodes
                       if n not in self.holders(i) and n not in self.refused.get(i, {})})
        added = [node.node_id for node in spares]
        block.nodes = block.nodes + tuple(added)
        grant = self.capabilities.put_grant(block.first, block.n, sorted(added),
                                            now + self.config.pending_timeout_s)
        return p.PutAlso([p.NodeRef(node.node_id, node.addr) for node in spares], grant, slow,
                         self.membership.suspects(mono))

    # -- reports -----------------------------------------------------------------------------

    def report(self, msg: p.PutReport, now: float, mono: float, peer: bytes = b"",
               *_: Any) -> None:
        """A data node stored (or refused) ids: note it; blobs of unknown ids are dropped.

        A report gets no reply (None): the node has nothing to do with one, and the master
        saves a send per pass of each node. A refused report is answered with the error.
        """
        node = arguments.node_id(msg.node_id)
        if not self.membership.speaks_for(node, peer):
            raise InvalidArgument(f"put reports for {node[:64]!r} come only from that data "
                                  "node's own connection")
        arguments.batch(len(msg.ids) + len(msg.failed), "ids")
        stray = []
        for item_id in msg.ids:
            block = self.by_id.get(item_id)
            if block is None or node not in block.nodes:
                # no producer holds it, or a report came late, after W others (repair makes
                # the copies an item still lacks): unless the master keeps it there, a stray
                kept = self.kept_on(item_id)
                if kept is None or node not in kept:
                    stray.append(item_id)
                continue
            holders = self.stored.get(item_id)
            if holders is None:
                self.stored[item_id] = [node]
            elif node not in holders:
                holders.append(node)
            self.touched.add(item_id)
        if msg.failed:
            why = msg.error[:200] or "refused"
            for item_id in msg.failed:
                block = self.by_id.get(item_id)
                if block is not None and node in block.nodes:
                    self.refused.setdefault(item_id, {})[node] = why
                    self.touched.add(item_id)
        if stray:
            self.deletes.order(node, stray)
        return None

    def take_news(self) -> set[int]:
        """Ids reported stored or refused since the last call."""
        news, self.touched = self.touched, set()
        return news

    def nodes_of(self, item_id: int) -> tuple[str, ...]:
        block = self.by_id.get(item_id)
        return block.nodes if block is not None else ()

    def holders(self, item_id: int) -> list[str]:
        return self.stored.get(item_id, [])

    def possible(self, item_id: int) -> int:
        """How many placed nodes may still store this id (those that did not refuse it)."""
        refused = self.refused.get(item_id, {})
        holders = self.holders(item_id)
        return sum(1 for n in self.nodes_of(item_id) if n in holders or n not in refused)

    def why_refused(self, item_id: int) -> str:
        return "; ".join(f"{node}: {why}" for node, why in self.refused.get(item_id, {}).items())

    # -- leaving the table -------------------------------------------------------------------

    def release(self, ids: list[int]) -> None:
        """These ids were enqueued (or staged): the table forgets them, their blobs stay."""
        for item_id in ids:
            block = self.by_id.pop(item_id, None)
            self.stored.pop(item_id, None)
            self.refused.pop(item_id, None)
            if block is not None:
                self._settle(block)

    def drop(self, ids: list[int]) -> None:
        """These ids will never be enqueued (a failed enqueue, an expired block): forget them
        and delete their blobs on every placed node, reported or not (a report may be lost)."""
        for item_id in ids:
            block = self.by_id.pop(item_id, None)
            if block is None:
                continue
            self.stored.pop(item_id, None)
            self.refused.pop(item_id, None)
            self.deletes.drop_blobs(item_id, block.nodes)
            self.touched.add(item_id)  # an enqueue still waiting on it learns it is gone
            self._settle(block)

    def forget_node(self, node_id: str) -> None:
        """An operator removed this node: what it reported stored no longer counts, and it
        stores nothing more, so an enqueue waiting on it settles with the other nodes, or fails."""
        for item_id, block in self.by_id.items():
            if node_id in block.nodes:
                holders = self.stored.get(item_id, [])
                if node_id in holders:
                    holders.remove(node_id)
                self.refused.setdefault(item_id, {})[node_id] = "the data node was removed"
                self.touched.add(item_id)

    def expire(self, mono: float) -> None:
        """Blocks past their time: ids some node reported are dropped (see ``drop``); ids no
        node ever mentioned were most likely never used, and are just forgotten."""
        while self.expiry and self.expiry[0][0] <= mono:
            _, first, block = heapq.heappop(self.expiry)
            if not block.left:
                continue
            mine = [i for i in range(first, first + block.n) if self.by_id.get(i) is block]
            self.drop([i for i in mine if i in self.stored or i in self.refused])
            for item_id in mine:
                if self.by_id.pop(item_id, None) is not None:
                    self._settle(block)

    def _settle(self, block: Block) -> None:
        block.left -= 1
        left = self.by_peer[block.peer] - 1
        if left:
            self.by_peer[block.peer] = left
        else:
            del self.by_peer[block.peer]
