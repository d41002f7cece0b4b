"""The master's data-node and cluster requests: heartbeats, copies, inventories, status."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from blizzard import protocol as p
from blizzard.errors import InvalidArgument
from master import checks
from master.records import NodeSeen

if TYPE_CHECKING:
    from master.server import MasterServer

log = logging.getLogger(__name__)


class NodeHandlers:
    """Mixed into MasterServer: what data nodes report and what operators ask."""

    def _heartbeat(self: "MasterServer", msg: p.Heartbeat, now: float, mono: float,
                   *_: Any) -> p.HeartbeatReply:
        if not msg.node_id or not msg.addr.startswith("tcp://"):
            raise InvalidArgument("a heartbeat needs a node id and a tcp:// address")
        fresh = self.membership.heartbeat(msg.node_id, msg.addr, msg.items, msg.bytes_used,
                                           msg.free_bytes, mono)
        if fresh:
            log.info("data node %s at %s is alive; asking for its inventory", msg.node_id, msg.addr)
            self.repair.start_inventory(msg.node_id)
            self.repair.rescan()
        if self.state.node_addrs.get(msg.node_id) != msg.addr:
            self.log_record(NodeSeen(msg.node_id, msg.addr))
        todo = self.deletes.pop(msg.node_id, [])
        if len(todo) > p.MAX_BATCH:
            self.deletes[msg.node_id] = todo[p.MAX_BATCH:]
            todo = todo[:p.MAX_BATCH]
        return p.HeartbeatReply(delete=todo, copies=self.repair.take_orders(msg.node_id),
                                inventory=fresh)

    def _replicated(self: "MasterServer", msg: p.Replicated, now: float, mono: float,
                    *_: Any) -> p.Ok:
        records, stale = self.repair.replicated(msg, mono)
        for rec in records:
            self.log_record(rec)
        if stale:
            self.deletes.setdefault(msg.target, []).extend(stale)
        return p.Ok()

    def _inventory(self: "MasterServer", msg: p.Inventory, now: float, mono: float,
                   *_: Any) -> p.Ok:
        records, delete = self.repair.inventory(msg, self.pending, mono)
        for rec in records:
            self.log_record(rec)
        if delete:  # in safe mode nothing is deleted yet: not every holder has reported
            target = self.held_deletes if self.safe_until else self.deletes
            target.setdefault(msg.node_id, []).extend(delete)
        return p.Ok()

    def _bad_replica(self: "MasterServer", msg: p.BadReplica, now: float, mono: float,
                     *_: Any) -> p.Ok:
        checks.same_length(ids=msg.ids, node_ids=msg.node_ids)
        for rec in self.repair.bad_replicas(msg.ids, msg.node_ids):
            log.warning("replicas of %d items on %s reported unreadable", len(rec.ids), rec.node)
            self.log_record(rec)
            self.deletes.setdefault(rec.node, []).extend(rec.ids)
        return p.Ok()

    def _status(self: "MasterServer", msg: p.Status, now: float, mono: float,
                *_: Any) -> p.ClusterStatus:
        nodes = [p.NodeStatus(n.node_id, n.addr, self.membership.is_alive(n, mono),
                              mono - n.last_seen, n.items, n.bytes_used, n.free_bytes)
                 for n in sorted(self.membership.nodes.values(), key=lambda n: n.node_id)]
        queues = [self.queue_stats(name, now) for name in sorted(self.state.queues)]
        under = self.repair.under_replicated(mono)
        return p.ClusterStatus(nodes, queues, under, self.config.replication)

    NODE_HANDLERS = {
        p.Heartbeat: _heartbeat,
        p.Replicated: _replicated,
        p.Inventory: _inventory,
        p.BadReplica: _bad_replica,
        p.Status: _status,
    }
