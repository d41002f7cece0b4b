"""Re-replication and inventory reconciliation: keep every item at R live replicas.

The master never moves payload bytes: it tells a live holder to copy blobs to a chosen
target (a ``CopyOrder`` in the holder's next heartbeat reply) and records the new replica
only when the holder reports the copy confirmed. Work is found by scanning item ids in
slices (after a node dies or joins, and once when safe mode ends) and is bounded in flight
so foreground traffic keeps flowing. Time is passed in; nothing here touches a socket.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from blizzard.wire import protocol as p
from master.nodes.membership import Membership
from master.state.machine import State
from master.state.records import AddReplicas, DropReplicas

log = logging.getLogger(__name__)

SCAN_SLICE = 20_000  # item ids examined per loop pass
MAX_IN_FLIGHT = 20_000  # items being copied at once
ORDER_ITEMS = 1_000  # ids per copy order
COPY_TIMEOUT_S = 15.0
INVENTORY_RETRY_S = 5.0  # an inventory of which nothing came this long is asked again


class Repairer:
    """Finds under-replicated items, plans copies, and reconciles node inventories."""

    def __init__(self, state: State, membership: Membership, replication: int) -> None:
        self.state = state
        self.membership = membership
        self.replication = replication
        self.scan: deque[int] = deque()
        # item id -> (give-up time (monotonic), source node, target node) of its ordered copy
        self.in_flight: dict[int, tuple[float, str, str]] = {}
        self.orders: dict[str, list[p.CopyOrder]] = {}  # source node id -> orders to hand out
        self.inventories: dict[str, tuple[int, set[int]]] = {}  # node -> (id mark, ids so far)
        self.inventory_news: dict[str, float] = {}  # node -> when asked, or its last chunk came
        self._next_expiry_check = 0.0
        self._under = (0.0, 0)  # (when counted, under-replicated items)

    def rescan(self) -> None:
        """Look at every item again (a node died or joined, or safe mode ended)."""
        self.scan = deque(self.state.items)
        self._under = (0.0, 0)  # the count must be taken afresh too

    def live_replicas(self, nodes: tuple[str, ...], now: float) -> list[str]:
        alive = self.membership.nodes
        return [n for n in nodes if n in alive and self.membership.is_alive(alive[n], now)]

    # -- planning ----------------------------------------------------------------------------

    def plan(self, now: float) -> None:
        """Examine a slice of the scan queue and turn under-replicated items into copy orders."""
        if now >= self._next_expiry_check and self.in_flight:
            self._next_expiry_check = now + 1.0
            for item_id, (until, _, _) in list(self.in_flight.items()):
                if until <= now:  # the copy was never confirmed: look again
                    del self.in_flight[item_id]
                    self.scan.append(item_id)
        if not self.scan or len(self.in_flight) >= MAX_IN_FLIGHT:
            return
        # a node still reporting its inventory is no target: a copy landing meanwhile would
        # be missing from its list and dropped again
        alive = sorted((n for n in self.membership.alive(now) if n.node_id not in self.inventories),
                       key=lambda n: (-n.free_bytes, n.node_id))
        if len(alive) < 2:
            return
        batches: dict[tuple[str, str], list[int]] = {}
        for _ in range(min(SCAN_SLICE, len(self.scan))):
            if len(self.in_flight) >= MAX_IN_FLIGHT:
                break
            item_id = self.scan.popleft()
            item = self.state.items.get(item_id)
            if item is None or item_id in self.in_flight:
                continue
            live = self.live_replicas(item.nodes, now)
            if not live or len(live) >= self.replication:
                continue  # nothing to copy from, or nothing to do
            target = next((n for n in alive if n.node_id not in item.nodes), None)
            if target is None:
                continue
            # rotate targets so one repair wave spreads over the cluster
            alive.append(alive.pop(alive.index(target)))
            source = live[item_id % len(live)]
            batches.setdefault((source, target.node_id), []).append(item_id)
            self.in_flight[item_id] = (now + COPY_TIMEOUT_S, source, target.node_id)
        for (source, target_id), ids in batches.items():
            ref = p.NodeRef(target_id, self.membership.nodes[target_id].addr)
            for start in range(0, len(ids), ORDER_ITEMS):
                part = ids[start:start + ORDER_ITEMS]
                self.orders.setdefault(source, []).append(p.CopyOrder(ref, part))

    def take_orders(self, node_id: str) -> list[p.CopyOrder]:
        return self.orders.pop(node_id, [])

    def node_died(self, node_id: str) -> None:
        """Forget a dead node's inventory and every copy from or to it; look at every item again.

        A copy to it that was still confirmed later would make it a replica again: for a
        removed node, one with no address (a phantom).
        """
        self.inventories.pop(node_id, None)
        self.inventory_news.pop(node_id, None)
        self.orders.pop(node_id, None)
        for source, orders in list(self.orders.items()):
            kept = [order for order in orders if order.target.node_id != node_id]
            if kept:
                self.orders[source] = kept
            else:
                del self.orders[source]
        for item_id, (_, source, target) in list(self.in_flight.items()):
            if node_id in (source, target):
                del self.in_flight[item_id]
        self.rescan()

    def _drop_unless_last(self, item_ids: list[int], node: str) -> list[int]:
        """The ids whose replica on ``node`` may be forgotten: never an item's last replica.

        A report that a replica is missing or bad is believed only while another replica
        remains; a false report can then cost a copy, never the item.
        """
        items = self.state.items
        return [i for i in item_ids
                if (item := items.get(i)) is not None and node in item.nodes
                and len(item.nodes) > 1]

    # -- reports from data nodes and clients -------------------------------------------------

    def _ordered(self, item_id: int, source: str, target: str) -> bool:
        """True if the master ordered this very copy and is still waiting for it."""
        flight = self.in_flight.get(item_id)
        return flight is not None and flight[1] == source and flight[2] == target

    def replicated(self, msg: p.Replicated, now: float) -> tuple[list[Any], list[int]]:
        """Records for a confirmed copy, plus ids the target should delete (item gone meanwhile).

        Only copies the master ordered, reported by the node it ordered them from, count: a
        claimed replica nobody asked for is ignored. Once an item is back to R live replicas,
        its replicas on dead nodes are forgotten: if such a node returns, its copy is excess
        and its inventory report deletes it.
        """
        records: list[Any] = []
        stale = []
        confirmed = []
        forget: dict[str, list[int]] = {}
        if msg.target not in self.state.node_addrs:  # removed by the operator meanwhile
            return [], []
        ordered = [i for i in msg.ids if self._ordered(i, msg.node_id, msg.target)]
        missing = [i for i in msg.missing if self._ordered(i, msg.node_id, msg.target)]
        for item_id in ordered:
            self.in_flight.pop(item_id, None)
            item = self.state.items.get(item_id)
            if item is None:
                stale.append(item_id)
                continue
            if msg.target not in item.nodes:
                confirmed.append(item_id)
            nodes = item.nodes + (() if msg.target in item.nodes else (msg.target,))
            live = self.live_replicas(nodes, now)
            if len(live) >= self.replication:
                for node in nodes:
                    if node not in live:
                        forget.setdefault(node, []).append(item_id)
        if confirmed:
            self._under = (0.0, 0)
            records.append(AddReplicas(confirmed, msg.target))
        records += [DropReplicas(ids, node) for node, ids in forget.items()]
        if missing:
            for item_id in missing:
                self.in_flight.pop(item_id, None)
            lost = self._drop_unless_last(missing, msg.node_id)
            self.scan.extend(missing)
            if lost:
                self._under = (0.0, 0)
                log.warning("node %s lost %d replicas; re-replicating from others",
                            msg.node_id, len(lost))
                records.append(DropReplicas(lost, msg.node_id))
        return records, stale

    def bad_replicas(self, ids: list[int], node_ids: list[str]) -> list[Any]:
        """Records dropping replicas a client could not read; their items are queued for repair.

        A replica is dropped only while another one, not reported in the same breath, is
        left: a report naming every replica of an item drops none of them.
        """
        reported: dict[int, set[str]] = {}
        for item_id, node in zip(ids, node_ids, strict=True):
            reported.setdefault(item_id, set()).add(node)
        by_node: dict[str, list[int]] = {}
        for item_id, nodes in reported.items():
            item = self.state.items.get(item_id)
            if item is None:
                continue
            bad = [n for n in item.nodes if n in nodes]
            if bad and len(bad) < len(item.nodes):
                for node in bad:
                    by_node.setdefault(node, []).append(item_id)
            elif bad:
                self.scan.append(item_id)
        records = [DropReplicas(v, k) for k, v in by_node.items()]
        if records:
            self._under = (0.0, 0)
        for v in by_node.values():
            self.scan.extend(v)
        return records

    def start_inventory(self, node_id: str, now: float = 0.0) -> None:
        self.inventories[node_id] = (self.state.id_hi, set())
        self.inventory_news[node_id] = now

    def inventory_stalled(self, node_id: str, now: float) -> bool:
        """An inventory was asked of ``node_id`` and nothing of it came for ``INVENTORY_RETRY_S``
        (a report lost on the way): it is asked again, since a node still reporting its
        inventory is no copy target and repair would wait on it for good."""
        return node_id in self.inventories and \
            now - self.inventory_news.get(node_id, now) >= INVENTORY_RETRY_S

    def expects_inventory(self, node_id: str) -> bool:
        return node_id in self.inventories

    def inventory(self, msg: p.Inventory, pending: Any, now: float) -> tuple[list[Any], list[int]]:
        """Reconcile a chunk of a node's inventory: (records to log, ids the node should delete).

        A blob is kept if its item wants it (counted again as a replica); deleted if the item
        is gone, or already has R live replicas elsewhere. When the last chunk arrives, items
        the master placed on the node but the node did not list are dropped from it -- only
        those committed before the inventory began, so writes racing with it are safe.
        """
        self._under = (0.0, 0)  # replicas are about to be counted again
        mark, seen = self.inventories[msg.node_id]  # the caller checked one was asked for
        self.inventory_news[msg.node_id] = now
        items = self.state.items
        seen.update(i for i in msg.ids if i in items)  # bounded by the items the master has
        delete, regained, excess = [], [], []
        for item_id in msg.ids:
            item = self.state.items.get(item_id)
            if item is None:
                if item_id not in pending:
                    delete.append(item_id)
                continue
            others = [n for n in item.nodes if n != msg.node_id]
            if len(self.live_replicas(tuple(others), now)) >= self.replication:
                delete.append(item_id)
                if msg.node_id in item.nodes:
                    excess.append(item_id)
            elif msg.node_id not in item.nodes:
                regained.append(item_id)
        records: list[Any] = [AddReplicas(regained, msg.node_id)] if regained else []
        if excess:
            records.append(DropReplicas(excess, msg.node_id))
        if msg.done:
            del self.inventories[msg.node_id]
            self.inventory_news.pop(msg.node_id, None)
            absent = [item.id for item in self.state.items.values()
                      if item.id < mark and msg.node_id in item.nodes and item.id not in seen]
            lost = self._drop_unless_last(absent, msg.node_id)
            if lost:
                records.append(DropReplicas(lost, msg.node_id))
            self.scan.extend(absent)
            log.info("inventory of %s: %d blobs, %d regained, %d to delete, %d missing",
                     msg.node_id, len(seen), len(regained), len(delete), len(lost))
        return records, delete

    def under_replicated(self, now: float, max_age_s: float = 2.0) -> int:
        """Items with fewer than R live replicas; a full scan, so reused for ``max_age_s``."""
        stamp, count = self._under
        if now - stamp > max_age_s or stamp == 0.0:
            count = sum(1 for item in self.state.items.values()
                        if len(self.live_replicas(item.nodes, now)) < self.replication)
            self._under = (now, count)
        return count
