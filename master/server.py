"""The master's server loop: decode -> decide records -> append to WAL -> apply -> fsync -> reply.

Each ``run_once`` pass drains up to a few hundred requests, lets the handlers log and apply
records, runs the timers (lease expiry, pending-enqueue expiry, long-poll waiters), then
makes everything durable with one fsync and only then sends the replies (group commit).
"""

from __future__ import annotations

import gc
import heapq
import logging
import os
import time
from typing import Any

import zmq

from blizzard import protocol as p
from blizzard.errors import BlizzardError, InvalidArgument
from blizzard.transport import RouterServer, error_reply
from master import checkpoint
from master.config import MasterConfig
from master.membership import Membership
from master.node_handlers import NodeHandlers
from master.queue_handlers import Pending, QueueHandlers, Waiter
from master.queues import TokenBucket
from master.repair import Repairer
from master.state import State
from master.wal import Wal

log = logging.getLogger(__name__)

EARLY = (p.Alloc,)  # replies that may leave before the pass's fsync if nothing was logged

class MasterServer(QueueHandlers, NodeHandlers):
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
        self.held_deletes: dict[str, list[int]] = {}  # inventory deletes waiting for safe mode to end
        self.pending: dict[int, Pending] = {}
        self.pending_expiry: list[tuple[float, list[int]]] = []
        self.waiters: list[Waiter] = []
        self.deletes: dict[str, list[int]] = {}  # node id -> blob ids it should drop
        self.buckets: dict[str, TokenBucket] = {}  # queue -> rate limiter (soft state)
        self.router = RouterServer(self.ctx, config.bind)
        self._replies: list[tuple[bytes, int, Any]] = []
        self.durable_id_hi = self.state.id_hi  # ids below this are reserved on disk
        self._stopping = False

    def _recover(self) -> tuple[State, int]:
        """Load the newest checkpoint, then replay the WAL segments after it.

        The cyclic garbage collector is off meanwhile and the result frozen: recovery makes
        millions of objects and none of them is garbage, so collection only costs time (more
        than half of it with 1M items, measured) and later pauses.
        """
        gc.disable()
        try:
            return self._load()
        finally:
            gc.freeze()
            gc.enable()

    def _load(self) -> tuple[State, int]:
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
            gc.disable()  # collecting would touch (and so copy) the parent's pages for nothing
            code = 1
            try:
                checkpoint.write(self.wal_dir, self.checkpoint_start, self.state.export_parts())
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
        checkpoint.write(self.wal_dir, start, self.state.export_parts())
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
            logged = self.wal.records_appended
            try:
                reply = self.handle(peer, rid, msg, now, mono)
            except BlizzardError as exc:
                reply = error_reply(exc)
            except Exception as exc:  # a bug must cost one request, never the server
                log.exception("internal error handling %s", p.op_name(msg))
                reply = p.Error("internal", f"internal error: {exc}")
            if reply is None:
                continue
            if type(msg) in EARLY and self.wal.records_appended == logged \
                    and self.next_id <= self.durable_id_hi:
                # An alloc that logged nothing, whose ids lie below a reservation already on
                # disk, reveals nothing the fsync could still lose. (Not heartbeats: their
                # delete orders may stem from acks not yet durable.)
                self.router.reply(peer, rid, reply)
            else:
                self._replies.append((peer, rid, reply))
        self.tick(now, mono)
        self.wal.flush()  # group commit: one fsync for the whole pass, before any reply
        self.durable_id_hi = self.state.id_hi
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
            self.release(expired, now, None, "lease expired")
        while self.pending_expiry and self.pending_expiry[0][0] <= mono:
            _, ids = heapq.heappop(self.pending_expiry)
            for item_id in ids:
                batch = self.pending.pop(item_id, None)
                if batch is not None:
                    batch.left -= 1
                    self.drop_blobs(item_id, batch.nodes)
        if self.waiters:
            self._serve_waiters(now, mono)
        self._watch_nodes(mono)

    def _watch_nodes(self, mono: float) -> None:
        """Notice nodes dying; plan re-replication once out of safe mode."""
        live = {n.node_id for n in self.membership.alive(mono)}
        for node_id in self.live_nodes - live:
            log.warning("data node %s is dead (silent for %.1fs)", node_id, self.config.dead_after_s)
            self.deletes.pop(node_id, None)  # its inventory is reconciled if it comes back
            self.repair.inventories.pop(node_id, None)
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
            for node_id, ids in self.held_deletes.items():
                self.deletes.setdefault(node_id, []).extend(ids)
            self.held_deletes.clear()
            self.repair.rescan()
        self.repair.plan(mono)

    def _serve_waiters(self, now: float, mono: float) -> None:
        still = []
        for w in self.waiters:
            ids = self._lease(w.msg, now, mono)
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

    _HANDLERS = {**QueueHandlers.QUEUE_HANDLERS, **NodeHandlers.NODE_HANDLERS}
