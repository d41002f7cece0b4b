"""The master's server loop: decode -> decide records -> append to WAL -> apply -> fsync -> reply.

Each ``run_once`` pass drains up to a few hundred requests, lets the handlers log and apply
records, runs the timers (lease expiry, pending-enqueue expiry, long-poll waiters), then
makes everything durable with one fsync and only then sends the replies (group commit).
"""

from __future__ import annotations

import heapq
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import zmq

from blizzard import protocol as p
from blizzard.errors import (BlizzardError, InvalidArgument, MasterStarting, NotEnoughDatanodes,
                             PayloadTooLarge, UnknownItem)
from blizzard.transport import RouterServer, error_reply
from master import checkpoint, checks
from master.config import MasterConfig
from master.membership import Membership
from master.records import AckItems, CommitItems, LeaseItems, NodeSeen, ReleaseItems, Reserve
from master.repair import Repairer
from master.state import LEASED, State
from master.wal import Wal

log = logging.getLogger(__name__)

MAX_WAIT_S = 300.0


@dataclass(slots=True)
class Pending:
    """An allocated, not yet committed item (memory only: a restart simply forgets it)."""

    queue: str
    size: int
    crc: int
    priority: int
    nodes: tuple[str, ...]


@dataclass(slots=True)
class Waiter:
    """A long-polling lease request parked until items arrive or its wait ends."""

    peer: bytes
    rid: int
    msg: p.Lease
    until: float  # monotonic


class MasterServer:
    """One master process: state machine, WAL, membership and the request loop."""

    def __init__(self, config: MasterConfig, ctx: zmq.Context | None = None) -> None:
        self.config = config.validate()
        self.ctx = ctx or zmq.Context.instance()
        os.makedirs(config.data_dir, exist_ok=True)
        self.wal_dir = os.path.join(config.data_dir, "wal")
        self.wal = Wal(self.wal_dir, segment_bytes=config.segment_bytes)
        self.state, replayed = self._recover()
        self.checkpoint_mark = -replayed  # a long replay makes the next checkpoint come sooner
        self.checkpointer: int | None = None  # pid of the child writing a checkpoint
        self.checkpoint_start = 0
        self.next_id = self.state.id_hi
        self.membership = Membership(config.dead_after_s)
        self.repair = Repairer(self.state, self.membership, config.replication)
        self.live_nodes: set[str] = set()
        # Safe mode (as HDFS's): until data nodes have had time to report after a start, a node
        # that has not heartbeated yet is not dead, so nothing is re-replicated or deleted.
        self.safe_until = time.monotonic() + config.dead_after_s
        self.pending: dict[int, Pending] = {}
        self.pending_expiry: list[tuple[float, list[int]]] = []
        self.waiters: list[Waiter] = []
        self.deletes: dict[str, list[int]] = {}  # node id -> blob ids it should drop
        self.router = RouterServer(self.ctx, config.bind)
        self._replies: list[tuple[bytes, int, Any]] = []
        self._stopping = False

    def _recover(self) -> tuple[State, int]:
        """Load the newest checkpoint, then replay the WAL segments after it."""
        started = time.monotonic()
        found = checkpoint.load_latest(self.wal_dir)
        wal_start, state = 0, State()
        if found is not None:
            wal_start, exported = found
            state = State.restore(exported)
        replayed = 0
        for body in self.wal.replay(wal_start):
            state.apply(p.unpack(body))
            replayed += 1
        log.info("recovered in %.3fs: checkpoint at segment %s, %d WAL records replayed, %d items, "
                 "id high-water %d", time.monotonic() - started,
                 wal_start if found else "none", replayed, len(state.items), state.id_hi)
        return state, replayed

    # -- checkpoints -------------------------------------------------------------------------

    def _maybe_checkpoint(self) -> None:
        if self.checkpointer is not None:
            pid, status = os.waitpid(self.checkpointer, os.WNOHANG)
            if pid == 0:
                return
            self.checkpointer = None
            if os.waitstatus_to_exitcode(status) != 0:
                log.critical("writing the checkpoint failed (exit status %d); stopping", status)
                os._exit(70)
            removed = checkpoint.prune(self.wal_dir, self.checkpoint_start)
            log.info("checkpoint at segment %d done; %d old files removed", self.checkpoint_start,
                     removed)
        if self.wal.records_written - self.checkpoint_mark < self.config.checkpoint_records:
            return
        # Everything before the new segment is in the state the child snapshots; the child
        # writes from a copy-on-write image, so this process keeps serving meanwhile.
        self.checkpoint_mark = self.wal.records_written
        self.checkpoint_start = self.wal.roll()
        pid = os.fork()
        if pid == 0:  # child: no sockets, no logging handlers, just the file
            code = 1
            try:
                checkpoint.write(self.wal_dir, self.checkpoint_start, self.state.export())
                code = 0
            finally:
                os._exit(code)
        self.checkpointer = pid

    def checkpoint_now(self) -> None:
        """Write a checkpoint synchronously (clean shutdown) and drop what it covers."""
        if self.checkpointer is not None:
            os.waitpid(self.checkpointer, 0)
            self.checkpointer = None
        self.wal.flush()
        start = self.wal.roll()
        checkpoint.write(self.wal_dir, start, self.state.export())
        checkpoint.prune(self.wal_dir, start)
        log.info("checkpoint at segment %d written", start)

    # -- loop --------------------------------------------------------------------------------

    def serve_forever(self) -> None:
        log.info("master serving on %s (data dir %s, R=%d, W=%d)", self.config.bind,
                 self.config.data_dir, self.config.replication, self.config.write_quorum)
        while not self._stopping:
            self.run_once(50)

    def stop(self) -> None:
        self._stopping = True

    def close(self) -> None:
        self.router.close()
        try:
            self.checkpoint_now()
        except OSError as exc:
            log.critical("final checkpoint failed: %s", exc)
            os._exit(70)
        self.wal.close()

    def run_once(self, timeout_ms: int) -> None:
        if self.waiters:
            soonest = min(w.until for w in self.waiters) - time.monotonic()
            timeout_ms = max(0, min(timeout_ms, int(soonest * 1000) + 1))
        requests = self.router.receive(timeout_ms)
        now, mono = time.time(), time.monotonic()
        for peer, rid, msg in requests:
            try:
                reply = self.handle(peer, rid, msg, now, mono)
            except BlizzardError as exc:
                reply = error_reply(exc)
            except Exception as exc:  # a bug must cost one request, never the server
                log.exception("internal error handling %s", p.op_name(msg))
                reply = p.Error("internal", f"internal error: {exc}")
            if reply is not None:
                self._replies.append((peer, rid, reply))
        self.tick(now, mono)
        self.wal.flush()  # group commit: one fsync for the whole pass, before any reply
        for peer, rid, reply in self._replies:
            self.router.reply(peer, rid, reply)
        self._replies.clear()
        self._maybe_checkpoint()

    def log_record(self, rec: Any) -> None:
        self.state.apply(rec)
        self.wal.append(p.pack(rec))

    # -- timers ------------------------------------------------------------------------------

    def tick(self, now: float, mono: float) -> None:
        expired = self.state.expired(now)
        if expired:
            log.info("%d leases expired; items return to their queues", len(expired))
            self.log_record(ReleaseItems(ids=expired, not_before=0.0))
        while self.pending_expiry and self.pending_expiry[0][0] <= mono:
            _, ids = heapq.heappop(self.pending_expiry)
            for item_id in ids:
                item = self.pending.pop(item_id, None)
                if item is not None:
                    for node in item.nodes:
                        self.deletes.setdefault(node, []).append(item_id)
        if self.waiters:
            self._serve_waiters(now, mono)
        self._watch_nodes(mono)

    def _watch_nodes(self, mono: float) -> None:
        """Notice nodes dying; plan re-replication once out of safe mode."""
        live = {n.node_id for n in self.membership.alive(mono)}
        for node_id in self.live_nodes - live:
            log.warning("data node %s is dead (silent for %.1fs)", node_id, self.config.dead_after_s)
            self.deletes.pop(node_id, None)  # its inventory is reconciled if it comes back
            for order in self.repair.orders.pop(node_id, []):
                for item_id in order.ids:
                    self.repair.in_flight.pop(item_id, None)
            self.repair.rescan()
        self.live_nodes = live
        if self.safe_until:
            reported = set(self.state.node_addrs) <= set(self.membership.nodes)
            if mono < self.safe_until and not (reported and self.state.node_addrs):
                return
            log.info("leaving safe mode with %d live data nodes", len(live))
            self.safe_until = 0.0
            self.repair.rescan()
        self.repair.plan(mono)

    def _serve_waiters(self, now: float, mono: float) -> None:
        still = []
        for w in self.waiters:
            ids = self._lease(w.msg, now)
            if ids or w.until <= mono:
                self._replies.append((w.peer, w.rid, self._leased(w.msg.queue, ids, [])))
            else:
                still.append(w)
        self.waiters = still

    # -- handlers ----------------------------------------------------------------------------

    def handle(self, peer: bytes, rid: int, msg: Any, now: float, mono: float) -> Any:
        handler = self._HANDLERS.get(type(msg))
        if handler is None:
            raise InvalidArgument(f"the master does not serve {p.op_name(msg)}")
        return handler(self, msg, now, mono, peer, rid)

    def _alloc(self, msg: p.Alloc, now: float, mono: float, *_: Any) -> p.Placement:
        checks.queue_name(msg.queue)
        n = checks.same_length(sizes=msg.sizes, crcs=msg.crcs, priorities=msg.priorities)
        checks.batch(n)
        for size in msg.sizes:
            if not 0 <= size <= self.config.max_item_bytes:
                raise PayloadTooLarge(f"an item of {size} bytes exceeds max-item-bytes "
                                      f"{self.config.max_item_bytes}")
        for crc, prio in zip(msg.crcs, msg.priorities):
            checks.checksum(crc)
            checks.priority(prio)
        nodes = self.membership.place(self.config.replication, set(msg.exclude), mono)
        if len(nodes) < self.config.write_quorum and self.safe_until:
            raise MasterStarting("the master is starting and waits for data nodes to report")
        if len(nodes) < self.config.write_quorum:
            raise NotEnoughDatanodes(f"{len(nodes)} live data nodes can take the write; "
                                     f"{self.config.write_quorum} needed")
        first = self.next_id
        self.next_id += n
        if self.next_id > self.state.id_hi:
            self.log_record(Reserve(id_hi=self.next_id + self.config.id_block))
        node_ids = tuple(node.node_id for node in nodes)
        ids = list(range(first, first + n))
        for i, item_id in enumerate(ids):
            self.pending[item_id] = Pending(msg.queue, msg.sizes[i], msg.crcs[i],
                                            msg.priorities[i], node_ids)
        heapq.heappush(self.pending_expiry, (mono + self.config.pending_timeout_s, ids))
        return p.Placement(ids=ids, nodes=[p.NodeRef(n.node_id, n.addr) for n in nodes],
                           min_copies=self.config.write_quorum,
                           deadline_s=self.config.pending_timeout_s)

    def _commit(self, msg: p.Commit, now: float, *_: Any) -> p.Committed:
        checks.batch(len(msg.ids))
        if msg.request and msg.request in self.state.recent_commits:
            return p.Committed(count=len(msg.ids))  # a retry of a commit that landed
        stored = set(msg.stored_on)
        unknown = [i for i in msg.ids if i not in self.pending and i not in self.state.items]
        if unknown:
            raise UnknownItem(f"{len(unknown)} ids are not pending (expired or never allocated), "
                              f"e.g. {unknown[:5]}; the enqueue must be retried")
        fresh = [i for i in msg.ids if i in self.pending]
        by_queue: dict[tuple[str, tuple[str, ...]], list[int]] = {}
        for item_id in fresh:
            item = self.pending[item_id]
            nodes = tuple(n for n in item.nodes if n in stored)
            if len(nodes) < self.config.write_quorum:
                raise NotEnoughDatanodes(f"item {item_id} is stored on {len(nodes)} of its placed "
                                         f"nodes; {self.config.write_quorum} needed")
            by_queue.setdefault((item.queue, nodes), []).append(item_id)
        for (queue, nodes), ids in by_queue.items():
            items = [self.pending.pop(i) for i in ids]
            self.log_record(CommitItems(queue=queue, ids=ids, sizes=[x.size for x in items],
                                        crcs=[x.crc for x in items],
                                        priorities=[x.priority for x in items],
                                        nodes=list(nodes), at=now, request=msg.request))
        return p.Committed(count=len(msg.ids))

    def _lease_request(self, msg: p.Lease, now: float, mono: float, peer: bytes,
                       rid: int) -> p.Leased | None:
        checks.queue_name(msg.queue)
        checks.batch(msg.n)
        checks.seconds(msg.lease_s, "lease_s", low=0, high=self.config.max_lease_s, low_ok=False)
        checks.seconds(msg.wait_s, "wait_s", low=0, high=MAX_WAIT_S)
        lost: list[int] = []
        if msg.ack_ids:
            lost = self._ack(p.Ack(msg.ack_ids, msg.ack_leases)).lost
        if msg.request in self.state.recent_leases:  # a retry: the same items again
            return self._leased(msg.queue, self.state.leased_by(msg.request), lost)
        ids = self._lease(msg, now)
        if ids or msg.wait_s == 0 or lost:  # lost acks are news the caller must get now
            return self._leased(msg.queue, ids, lost)
        self.waiters.append(Waiter(peer, rid, msg, mono + msg.wait_s))
        return None

    def _lease(self, msg: p.Lease, now: float) -> list[int]:
        ids = self.state.head(msg.queue, msg.n, now)
        if ids:
            first = self.state.lease_seq + 1
            leases = list(range(first, first + len(ids)))
            self.log_record(LeaseItems(ids=ids, leases=leases, deadline=now + msg.lease_s,
                                       request=msg.request))
        return ids

    def _leased(self, queue: str, ids: list[int], lost: list[int]) -> p.Leased:
        """Describe leased items column by column; replica sets are shared between items."""
        items = [self.state.items[i] for i in ids]
        set_index: dict[tuple[str, ...], int] = {}
        replica_set = []
        for item in items:
            k = set_index.get(item.nodes)
            if k is None:
                k = set_index[item.nodes] = len(set_index)
            replica_set.append(k)
        return p.Leased(queue, ids, [i.lease for i in items], [i.size for i in items],
                        [i.crc for i in items], [i.attempts for i in items],
                        [i.priority for i in items], [i.enqueued_at for i in items], replica_set,
                        [p.ReplicaSet(self._refs(nodes)) for nodes in set_index], lost)

    def _refs(self, node_ids: tuple[str, ...]) -> list[p.NodeRef]:
        """Replica addresses, live nodes first."""
        mono = time.monotonic()
        refs = []
        for node_id in node_ids:
            node = self.membership.nodes.get(node_id)
            alive = node is not None and self.membership.is_alive(node, mono)
            addr = node.addr if node is not None else self.state.node_addrs.get(node_id, "")
            refs.append((not alive, p.NodeRef(node_id, addr)))
        refs.sort(key=lambda r: r[0])
        return [r for _, r in refs]

    def _settle(self, ids: list[int], leases: list[int]) -> tuple[list[int], list[int], int]:
        """Split (id, lease) pairs into still-held leases, lost leases, and already-gone ids."""
        checks.batch(checks.same_length(ids=ids, leases=leases))
        held, lost, gone = [], [], 0
        for item_id, lease in zip(ids, leases):
            item = self.state.items.get(item_id)
            if item is None:
                gone += 1
            elif item.status == LEASED and item.lease == lease:
                held.append(item_id)
            else:
                lost.append(item_id)
        return held, lost, gone

    def _ack(self, msg: p.Ack, *_: Any) -> p.Acked:
        held, lost, gone = self._settle(msg.ids, msg.leases)
        if held:
            for item_id in held:
                for node in self.state.items[item_id].nodes:
                    self.deletes.setdefault(node, []).append(item_id)
            self.log_record(AckItems(ids=held))
        return p.Acked(done=len(held) + gone, lost=lost)

    def _nack(self, msg: p.Nack, now: float, *_: Any) -> p.Acked:
        checks.seconds(msg.delay_s, "delay_s", low=0, high=365 * 86400.0)
        held, lost, gone = self._settle(msg.ids, msg.leases)
        if held:
            self.log_record(ReleaseItems(ids=held, not_before=now + msg.delay_s if msg.delay_s else 0.0))
        return p.Acked(done=len(held) + gone, lost=lost)

    def _extend(self, msg: p.Extend, now: float, *_: Any) -> p.Acked:
        checks.seconds(msg.lease_s, "lease_s", low=0, high=self.config.max_lease_s, low_ok=False)
        held, lost, gone = self._settle(msg.ids, msg.leases)
        lost += [i for i in msg.ids if i not in self.state.items]  # gone: nothing to extend
        if held:
            self.log_record(LeaseItems(ids=held, leases=[self.state.items[i].lease for i in held],
                                       deadline=now + msg.lease_s, request=""))
        return p.Acked(done=len(held), lost=lost)

    def _queue_stats(self, name: str, now: float) -> p.QueueStats:
        q = self.state.queues.get(name)
        pending = sum(1 for x in self.pending.values() if x.queue == name) if self.pending else 0
        if q is None:
            return p.QueueStats(name, 0, 0, 0, pending, 0.0)
        self.state.promote_due(q, now)
        oldest = 0.0
        for _, item_id, gen in q.ready[:1]:
            item = self.state.items.get(item_id)
            if item is not None:
                oldest = max(0.0, now - item.enqueued_at)
        return p.QueueStats(name, q.n_ready, q.n_delayed, q.n_leased, pending, oldest)

    def _stats(self, msg: p.Stats, now: float, *_: Any) -> p.QueueStats:
        return self._queue_stats(checks.queue_name(msg.queue), now)

    def _status(self, msg: p.Status, now: float, mono: float, *_: Any) -> p.ClusterStatus:
        nodes = [p.NodeStatus(n.node_id, n.addr, self.membership.is_alive(n, mono),
                              mono - n.last_seen, n.items, n.bytes_used, n.free_bytes)
                 for n in sorted(self.membership.nodes.values(), key=lambda n: n.node_id)]
        queues = [self._queue_stats(name, now) for name in sorted(self.state.queues)]
        under = self.repair.under_replicated(mono)
        return p.ClusterStatus(nodes, queues, under, self.config.replication)

    def _heartbeat(self, msg: p.Heartbeat, now: float, mono: float, *_: Any) -> p.HeartbeatReply:
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

    def _replicated(self, msg: p.Replicated, now: float, mono: float, *_: Any) -> p.Ok:
        records, stale = self.repair.replicated(msg, mono)
        for rec in records:
            self.log_record(rec)
        if stale:
            self.deletes.setdefault(msg.target, []).extend(stale)
        return p.Ok()

    def _inventory(self, msg: p.Inventory, now: float, mono: float, *_: Any) -> p.Ok:
        records, delete = self.repair.inventory(msg, self.pending, mono)
        for rec in records:
            self.log_record(rec)
        if delete:
            self.deletes.setdefault(msg.node_id, []).extend(delete)
        return p.Ok()

    def _bad_replica(self, msg: p.BadReplica, now: float, mono: float, *_: Any) -> p.Ok:
        checks.same_length(ids=msg.ids, node_ids=msg.node_ids)
        for rec in self.repair.bad_replicas(msg.ids, msg.node_ids):
            log.warning("replicas of %d items on %s reported unreadable", len(rec.ids), rec.node)
            self.log_record(rec)
            self.deletes.setdefault(rec.node, []).extend(rec.ids)
        return p.Ok()

    _HANDLERS = {
        p.Alloc: _alloc,
        p.Commit: _commit,
        p.Lease: _lease_request,
        p.Ack: _ack,
        p.Nack: _nack,
        p.Extend: _extend,
        p.Stats: _stats,
        p.Status: _status,
        p.Heartbeat: _heartbeat,
        p.Replicated: _replicated,
        p.Inventory: _inventory,
        p.BadReplica: _bad_replica,
    }
