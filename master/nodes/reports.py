"""What data nodes tell the master: heartbeats, confirmed copies, inventories, bad replicas.

Reports are not taken on trust: a live node's address cannot be claimed by another sender,
an inventory is accepted only when the master asked that node for one, a copy counts only if
the master ordered it, and no report ever drops an item's last replica.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from blizzard.net.addrs import check_addr
from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument
from master.config import MasterConfig
from master.nodes.blob_deletes import Deletes
from master.nodes.grant_keys import CapabilityKeys
from master.nodes.membership import MAX_NODES, Membership
from master.nodes.repair import Repairer
from master.nodes.safe_mode import SafeMode
from master.rules import arguments
from master.state.item import LEASED
from master.state.machine import State
from master.state.records import NodeSeen

log = logging.getLogger(__name__)


class Staged(Protocol):
    """Ids handed out or staged (``Enqueues``), asked by id: their blobs are not strays.

    Not ``Container[int]``: a container takes any object to look up, ``Enqueues`` an id.
    """

    def __contains__(self, item_id: int, /) -> bool: ...


class DatanodeReports:
    """Requests only data nodes send, and noticing nodes that went silent."""

    def __init__(self, config: MasterConfig, state: State, log_record: Callable[[Any], None],
                 membership: Membership, repair: Repairer, deletes: Deletes,
                 safe_mode: SafeMode, pending: Staged,
                 capabilities: CapabilityKeys,
                 role_of: Callable[[bytes], str | None] = lambda peer: None) -> None:
        self.config = config
        self.state = state
        self.log = log_record
        self.membership = membership
        self.repair = repair
        self.deletes = deletes
        self.safe_mode = safe_mode
        self.pending = pending  # ids handed out or staged: their blobs are not stray
        self.capabilities = capabilities
        self.role_of = role_of  # a peer's key's role (None: security off)
        self.live: set[str] = set()
        self.silent: set[str] = set()  # live nodes silent past suspect_after_s (logged once)

    def heartbeat(self, msg: p.Heartbeat, now: float, mono: float, peer: bytes = b"",
                  *_: Any) -> p.HeartbeatReply:
        arguments.node_id(msg.node_id)
        check_addr(msg.addr)
        if msg.node_id not in self.state.node_addrs and len(self.state.node_addrs) >= MAX_NODES:
            raise InvalidArgument(f"the master knows {MAX_NODES} data nodes; no more join")
        fresh = self.membership.heartbeat(msg.node_id, msg.addr, msg.items, msg.bytes_used,
                                          msg.free_bytes, mono, peer)
        if self.state.node_addrs.get(msg.node_id) != msg.addr:
            self.log(NodeSeen(msg.node_id, msg.addr))
        ask = fresh
        if fresh:
            log.info("data node %s at %s is alive; asking for its inventory", msg.node_id, msg.addr)
            self.repair.start_inventory(msg.node_id, mono)
            self.repair.rescan()
        elif self.repair.inventory_stalled(msg.node_id, mono):
            log.warning("no inventory from data node %s yet; asking again", msg.node_id)
            self.repair.start_inventory(msg.node_id, mono)
            ask = True
        return p.HeartbeatReply(delete=self.deletes.take(msg.node_id),
                                copies=self.repair.take_orders(msg.node_id), inventory=ask,
                                keys=self.capabilities.keys_for(msg.node_id))

    def replicated(self, msg: p.Replicated, now: float, mono: float, *_: Any) -> p.Ok:
        records, stale = self.repair.replicated(msg, mono)
        for rec in records:
            self.log(rec)
        if stale:
            self.deletes.order(msg.target, stale)
        return p.Ok()

    def inventory(self, msg: p.Inventory, now: float, mono: float, *_: Any) -> p.Ok:
        if not self.repair.expects_inventory(msg.node_id):
            raise InvalidArgument(f"no inventory of {msg.node_id[:64]!r} was asked for")
        records, delete = self.repair.inventory(msg, self.pending, mono)
        for rec in records:
            self.log(rec)
        if delete:  # in safe mode nothing is deleted yet: not every holder has reported
            self.deletes.order(msg.node_id, delete, hold=self.safe_mode.on)
        return p.Ok()

    def bad_replica(self, msg: p.BadReplica, now: float, mono: float, peer: bytes = b"",
                    *_: Any) -> p.Ok:
        """A reader's report of damaged copies; from a client key, only of items leased now
        (a client that may ack an item may as well report its copies bad, no other)."""
        if self.role_of(peer) not in (None, "node") and len(msg.ids) == len(msg.node_ids):
            items = self.state.items
            kept = [(i, n) for i, n in zip(msg.ids, msg.node_ids, strict=True)
                    if (item := items.get(i)) is not None and item.status == LEASED]
            if msg.ids and not kept:
                return p.Ok()  # nothing it may report
            msg = p.BadReplica([i for i, _ in kept], [n for _, n in kept])
        arguments.batch(arguments.same_length(ids=msg.ids, node_ids=msg.node_ids))
        for rec in self.repair.bad_replicas(msg.ids, msg.node_ids):
            log.warning("replicas of %d items on %s reported unreadable", len(rec.ids), rec.node)
            self.log(rec)
            self.deletes.order(rec.node, rec.ids)
        return p.Ok()

    def watch(self, mono: float) -> None:
        """Notice nodes going silent and dying; plan re-replication once out of safe mode."""
        alive = self.membership.alive(mono)
        live = {n.node_id for n in alive}
        silent = {n.node_id for n in alive
                  if mono - n.last_seen >= self.membership.suspect_after_s}
        for node_id in silent - self.silent:
            log.warning("data node %s is suspect (silent for %.1fs): placed only if need be, "
                        "read from last", node_id, self.membership.suspect_after_s)
        self.silent = silent
        for node_id in self.live - live:
            log.warning("data node %s is dead (silent for %.1fs)", node_id,
                        self.config.dead_after_s)
            self.deletes.forget(node_id)
            self.repair.node_died(node_id)
        self.live = live
        if self.safe_mode.leave_now(self.state, self.membership, mono):
            self.deletes.release_held()
            self.repair.rescan()
        if not self.safe_mode.on:
            self.repair.plan(mono)
