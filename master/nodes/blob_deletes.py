"""Blob delete orders: which data node should drop which blobs, handed out in heartbeat replies.

Orders that stem from an inventory are held while the master is in safe mode (not every
holder has reported yet); orders that stem from acks go out at once. The lists are bounded:
past the caps an order is dropped with a warning, which costs only disk, since a node's next
inventory deletes every blob whose item is gone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from blizzard.wire.protocol import MAX_BATCH

log = logging.getLogger(__name__)

MAX_PER_NODE = 2_000_000  # ids waiting for one node
MAX_TOTAL = 4_000_000  # ids waiting for all nodes together


class Deletes:
    """Pending delete orders per node, and those held until safe mode ends."""

    def __init__(self) -> None:
        self.orders: dict[str, list[int]] = {}
        self.held: dict[str, list[int]] = {}
        self.total = 0
        self.dropped = 0

    def order(self, node: str, ids: Iterable[int], *, hold: bool = False) -> None:
        """Tell ``node`` to drop these blobs (``hold``: not before safe mode ends)."""
        ids = list(ids)
        target = (self.held if hold else self.orders).setdefault(node, [])
        room = max(0, min(MAX_PER_NODE - len(target), MAX_TOTAL - self.total))
        if len(ids) > room:
            if not self.dropped:
                log.warning("delete orders over their cap; dropping some (the node's next "
                            "inventory deletes those blobs)")
            self.dropped += len(ids) - room
            ids = ids[:room]
        target.extend(ids)
        self.total += len(ids)

    def drop_blobs(self, item_id: int, nodes: Iterable[str]) -> None:
        """Every holder of an item that is gone should delete its blob (the ack path: kept
        cheap)."""
        orders = self.orders
        for node in nodes:
            target = orders.get(node)
            if target is None:
                target = orders[node] = []
            if len(target) < MAX_PER_NODE and self.total < MAX_TOTAL:
                target.append(item_id)
                self.total += 1
            else:
                self.order(node, (item_id,))  # over a cap: counted and warned there

    def drop_blobs_of(self, ids: list[int], holders: Iterable[tuple[str, ...]]) -> None:
        """``drop_blobs`` for a batch (``holders[i]``: item i's nodes), with one order per node
        and replica set: the ack path's way, a list extension where ``drop_blobs`` is a call
        and an append per item and node."""
        by_set: dict[tuple[str, ...], list[int]] = {}
        for item_id, nodes in zip(ids, holders, strict=True):
            group = by_set.get(nodes)
            if group is None:
                group = by_set[nodes] = []
            group.append(item_id)
        for nodes, group in by_set.items():
            for node in nodes:
                self.order(node, group)

    def take(self, node: str) -> list[int]:
        """Up to one request's worth of ids for ``node`` (its heartbeat reply carries them)."""
        todo = self.orders.pop(node, [])
        if len(todo) > MAX_BATCH:
            self.orders[node] = todo[MAX_BATCH:]
            todo = todo[:MAX_BATCH]
        self.total -= len(todo)
        return todo

    def forget(self, node: str) -> None:
        """A node died: its inventory is reconciled if it comes back, so its orders can go."""
        for table in (self.orders, self.held):
            self.total -= len(table.pop(node, ()))

    def release_held(self) -> None:
        """Safe mode ended: held orders go out with the next heartbeats."""
        for node, ids in self.held.items():
            self.orders.setdefault(node, []).extend(ids)
        self.held.clear()

    def waiting(self, node: str) -> int:
        return len(self.orders.get(node, ()))
