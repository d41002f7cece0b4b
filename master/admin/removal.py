"""Operator removals (admin key): forget a dead data node, delete one item, delete a queue.

Each refuses what would destroy something in use unless forced (``InUse``): a live node (never
forced), a leased item, a queue with items or with enqueues on their way into it (staged and
not committed, or waiting for their data nodes). What it removes is logged first (``ForgetNode``,
``DeleteItems``, ``DeleteQueue``), so it stays removed after a restart; blobs that lost their
item are deleted on their holders through the usual delete orders.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from blizzard.wire import protocol as p
from blizzard.wire.errors import InUse, InvalidArgument, MasterStarting, UnknownItem, UnknownQueue
from master.consume.leases import Leases
from master.nodes.blob_deletes import Deletes
from master.nodes.membership import Membership
from master.nodes.repair import Repairer
from master.nodes.safe_mode import SafeMode
from master.produce.enqueue import Enqueues
from master.rules import arguments
from master.state.item import LEASED
from master.state.machine import State
from master.state.records import DeleteItems, DeleteQueue, ForgetNode


class Removals:
    """The handlers of ``RemoveNode``, ``DeleteItem`` and ``DeleteQueue``."""

    def __init__(self, state: State, log_record: Callable[[Any], None], membership: Membership,
                 safe_mode: SafeMode, repair: Repairer, deletes: Deletes, leases: Leases,
                 enqueues: Enqueues) -> None:
        self.state = state
        self.log = log_record
        self.membership = membership
        self.safe_mode = safe_mode
        self.repair = repair
        self.deletes = deletes
        self.leases = leases
        self.enqueues = enqueues

    # -- data nodes ----------------------------------------------------------------------------

    def remove_node(self, msg: p.RemoveNode, now: float, mono: float, *_: Any) -> p.Removed:
        """Forget a dead node; its items are re-replicated from their other copies.

        Refused while the master is in safe mode (a node that has not reported yet is not
        dead), for a live node, and for a node holding an item's only replica.
        """
        node_id = arguments.node_id(msg.node_id)
        node = self.membership.nodes.get(node_id)
        if node is None and node_id not in self.state.node_addrs:
            raise InvalidArgument(f"no data node {node_id!r} is known to this master")
        if self.safe_mode.on:
            raise MasterStarting("the master is starting and waits for data nodes to report; "
                                 "a node can be removed once that is over")
        if node is not None and self.membership.is_alive(node, mono):
            raise InUse(f"data node {node_id} is alive (heartbeat {mono - node.last_seen:.1f} s "
                        "ago); stop it first: only a dead node can be removed")
        held = [item for item in self.state.items.values() if node_id in item.nodes]
        only = [item.id for item in held if len(item.nodes) == 1]
        if only:
            raise InUse(f"data node {node_id} holds the only replica of {len(only)} items (e.g. "
                        f"id {only[0]}); bring it back, or delete those items first")
        self.log(ForgetNode(node_id))
        self.membership.nodes.pop(node_id, None)
        self.deletes.forget(node_id)
        self.enqueues.forget_node(node_id)
        self.repair.node_died(node_id)  # every item is looked at again: re-replication
        return p.Removed(len(held))

    # -- items and queues ----------------------------------------------------------------------

    def delete_item(self, msg: p.DeleteItem, now: float, *_: Any) -> p.Removed:
        """Delete an item of the queue, or a dead item that came from it (``origin``)."""
        queue = arguments.queue_name(msg.queue)
        item = self.state.items.get(msg.id)
        if item is None or (item.queue != queue and self.state.origins.get(msg.id) != queue):
            raise UnknownItem(f"queue {queue!r} holds no item {msg.id}")
        if item.status == LEASED and not msg.force:
            deadline = self.state.held[msg.id][1]
            raise InUse(f"item {msg.id} is leased for {max(0.0, deadline - now):.1f} s more, "
                        "so a consumer may be working on it; force to delete it anyway")
        self.log(DeleteItems([msg.id]))
        self.deletes.drop_blobs(msg.id, item.nodes)
        return p.Removed(1)

    def delete_queue(self, msg: p.DeleteQueue, now: float, *_: Any) -> p.Removed:
        """Delete a queue, its settings and its items (its dead-letter queue is another queue)."""
        queue = arguments.queue_name(msg.queue)
        q = self.state.queues.get(queue)
        if q is None:
            raise UnknownQueue(f"no queue named {queue!r}")
        held = q.n_ready + q.n_delayed + q.n_leased
        coming = self._coming(queue)
        if (held or coming) and not msg.force:
            why = [f"holds {held} items ({q.n_leased} leased)"] if held else []
            if coming:
                why.append(f"has {coming} items on their way in (staged and not committed, or "
                           "waiting for their data nodes), which would make it again with "
                           "default settings")
            raise InUse(f"queue {queue!r} {' and '.join(why)}; force to delete them with it "
                        "(items on their way in are dropped: their commit or enqueue fails)")
        doomed = [(item.id, item.nodes) for item in self.state.items.values()
                  if item.queue == queue]
        self.log(DeleteQueue(queue))
        for item_id, nodes in doomed:
            self.deletes.drop_blobs(item_id, nodes)
        self.enqueues.drop_queue(queue)
        self.leases.buckets.pop(queue, None)
        return p.Removed(len(doomed))

    def _coming(self, queue: str) -> int:
        """Items staged or parked for ``queue``: not in it yet, but their commit would make it."""
        return self.enqueues.count(queue) + sum(len(w.msg.ids) for w in
                                                self.enqueues.waiting.values()
                                                if w.msg.queue == queue)
