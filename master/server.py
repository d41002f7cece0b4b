"""The master's server loop: decode -> decide records -> append to WAL -> apply -> fsync -> reply.

Each ``run_once`` pass drains up to a few hundred requests and hands each to its handler
(``ROUTES`` below says who serves which op, who may send it and what it logs), runs the timers
(lease expiry, pending-enqueue expiry, long-poll waiters, dead nodes), then makes everything
durable with one fsync and only then sends the replies (group commit).

The concepts live in collaborators: ``ItemIds`` (ids), ``Blocks`` (ids handed out, put
reports), ``Enqueues`` (enqueue, commit, staged),
``Leases`` (lease, ack, nack, extend, waiters, expiry), ``QueueAdmin``, ``DatanodeReports``,
``Deletes``, ``SafeMode``, ``CapabilityKeys`` (the grants' signing keys), ``ClusterIdentity``
(the cluster id heartbeats are checked against), ``Removals`` (node remove, item and queue
deletes) and ``MetaSync`` (item metadata changes for the data nodes); each gets ``log_record``
to change durable state.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from time import perf_counter
from typing import Any

import zmq

from blizzard.host.file_modes import private_dir
from blizzard.net import keys as k
from blizzard.net import secure
from blizzard.server import ready_file
from blizzard.server.registry import ADMIN, CLIENT, NODE, ROLES, STANDBY, Route, Routes
from blizzard.server.router import Router, RouterServer, error_reply
from blizzard.server.sync_hold import SyncHold
from blizzard.wire import protocol as p
from blizzard.wire.errors import BlizzardError, Forbidden, InvalidArgument
from blizzard.wire.release import RELEASE
from master.admin.operations import QueueAdmin
from master.admin.removal import Removals
from master.config import MasterConfig
from master.consume.leases import Leases
from master.consume.progress import Progress
from master.consume.pushes import Pushes
from master.consume.schedule_runs import ScheduleRuns
from master.ha.wal_shipping import Replication
from master.jobs.http_delivery import Tasks
from master.jobs.schedules import ScheduleDesk
from master.jobs.status import JobDesk
from master.log.recovery import Checkpointer, recover
from master.log.wal import MemoryWal, Wal
from master.metrics import MasterMetrics
from master.nodes.blob_deletes import Deletes
from master.nodes.cluster_id import ClusterIdentity
from master.nodes.grant_keys import CapabilityKeys
from master.nodes.membership import Membership
from master.nodes.meta_sync import MetaSync
from master.nodes.node_keys import NodeKeys
from master.nodes.repair import Repairer
from master.nodes.reports import DatanodeReports
from master.nodes.safe_mode import SafeMode
from master.produce.enqueue import Enqueues
from master.produce.ids import ItemIds
from master.produce.placements import Blocks
from master.rules.queue_policy import QueuePolicy
from master.shard.heads import Heads, claim_shard
from master.state import records
from master.state.counts import QueueCounts
from master.state.machine import State
from master.wakes import Wakes

log = logging.getLogger(__name__)

# The largest request the master takes: an enqueue of 10,000 items with 256-character keys is
# under 3 MiB; the master never sees payloads.
MAX_REQUEST_BYTES = 8 * 1024 * 1024

Handler = Callable[[Any, float, float, bytes, int], Any]

# Every request the master serves: its handler (on ``MasterServer``), the roles whose keys may
# send it with security on (``blizzard/server/registry.py``; an op routed nowhere is refused to
# all), and the WAL records it may log. The dispatch table and the allow-list are made from it.
# Besides, a client may create a queue (``Configure`` with ``create``, as enqueueing to a new
# queue does: ``_allowed``); ``BadReplica`` comes from readers: from a client it counts only
# for items leased at the time.
ANYONE, USERS, OPERATORS = ROLES, (CLIENT, ADMIN), (ADMIN,)
R = records
ROUTES = Routes([
    #     op              handler                  who may send  WAL records it may log
    Route(p.Ping,         "ping",                  ANYONE),
    Route(p.Hello,        "hello",                 ANYONE),
    Route(p.Status,       "admin.status",          ANYONE),
    # producers: ids and where to put them, enqueue, commit of staged items
    # (master/produce/enqueue.py)
    Route(p.Place,        "id_blocks.place",       USERS,     (R.Reserve,)),
    Route(p.Enqueue,      "enqueue",               USERS,     (R.CommitItems, R.ExpireUniques)),
    Route(p.Commit,       "commit",                USERS,     (R.CommitItems,)),
    # consumers: leases and how they end (master/consume/leases.py)
    Route(p.Lease,        "lease",                 USERS,     (R.LeaseItems, R.AckItems)),
    Route(p.Ack,          "leases.ack",            USERS,     (R.AckItems,)),
    Route(p.Nack,         "leases.nack",           USERS,     (R.ReleaseItems,)),
    Route(p.Extend,       "leases.extend",         USERS,     (R.LeaseItems, R.ProgressItems)),
    Route(p.Regrant,      "leases.regrant",        USERS),
    Route(p.BadReplica,   "datanodes.bad_replica", USERS,     (R.DropReplicas,)),
    # HTTP push delivery (master/jobs/http_delivery.py); a queue's head, for sharding
    # (master/shard/heads.py)
    Route(p.Lookup,       "tasks.lookup",          USERS),
    Route(p.Bury,         "tasks.bury",            USERS,     (R.BuryItems, R.ReleaseItems)),
    Route(p.TaskStats,    "tasks.task_stats",      USERS),
    Route(p.Head,         "heads.head",            USERS),
    # jobs: status, results, cancel (master/jobs/status.py)
    Route(p.Jobs,         "jobs.jobs",             USERS),
    Route(p.InProgress,   "jobs.in_progress",      USERS),
    Route(p.Cancel,       "jobs.cancel",           USERS,     (R.CancelItems,)),
    # schedules (master/jobs/schedules.py): a worker declares them; an admin removes them
    Route(p.SetSchedule,  "set_schedule",          USERS,     (R.CommitItems, R.AddSchedule)),
    Route(p.ListSchedules, "schedules.list",       USERS),
    Route(p.RemoveSchedule, "schedules.remove",    OPERATORS, (R.DropSchedule,)),
    # queues (master/admin/operations.py): a client reads them, an admin changes them
    Route(p.Stats,        "admin.stats",           USERS),
    Route(p.ListQueues,   "admin.list_queues",     USERS),
    Route(p.Configure,    "admin.configure",       OPERATORS, (R.ConfigureQueue,)),
    Route(p.Purge,        "admin.purge",           OPERATORS, (R.DeleteItems,)),
    Route(p.Redrive,      "admin.redrive",         OPERATORS, (R.RedriveItems, R.WakeItems)),
    Route(p.Peek,         "admin.peek",            OPERATORS),
    # operator removals: forget a dead node, delete an item or a queue (master/admin/removal.py)
    Route(p.RemoveNode,   "removals.remove_node",  OPERATORS, (R.ForgetNode,)),
    Route(p.DeleteItem,   "removals.delete_item",  OPERATORS, (R.DeleteItems,)),
    Route(p.DeleteQueue,  "removals.delete_queue", OPERATORS, (R.DeleteQueue,)),
    # data nodes, each on its own node id only (the methods below; master/nodes/reports.py)
    Route(p.Heartbeat,    "heartbeat",             (NODE,),   (R.NodeKeyBound, R.NodeSeen)),
    Route(p.PutReport,    "put_report",            (NODE,)),
    Route(p.Replicated,   "replicated",            (NODE,),   (R.AddReplicas, R.DropReplicas)),
    Route(p.Inventory,    "inventory",             (NODE,),   (R.AddReplicas, R.DropReplicas)),
    # leases a node answers (master/consume/pushes.py)
    Route(p.AwaitServes,  "await_serves",          (NODE,)),
    # a standby following the log (master/ha/wal_shipping.py)
    Route(p.Follow,       "replication.follow",    (STANDBY,), (R.StandbySynced,)),
])
ALLOWED = ROUTES.allowed  # role -> the ops its keys may send
NODE_OPS = ROUTES.only(NODE)  # for the refusal's words: "only data nodes may send ..."
ADMIN_OPS = ROUTES.only(ADMIN)  # "... it needs an admin key"


def _soonest(heap: list[tuple[float, Any, Any]]) -> float | None:
    """The deadline at the top of a heap of (monotonic deadline, ...): None if empty."""
    return heap[0][0] if heap else None


class MasterServer:
    """One master process: state machine, WAL, collaborators and the request loop.

    ``wal`` and ``router`` may be given (an in-memory ``MemoryWal``, a stand-in router), so
    tests can run the request handling in process; so may the ``recovered`` state and the
    number of records replayed (a standby being promoted hands over its own).
    """

    def __init__(self, config: MasterConfig, ctx: zmq.Context | None = None, *,
                 wal: Wal | MemoryWal | None = None, router: Router | None = None,
                 recovered: tuple[State, int] | None = None) -> None:
        self.config = config.validate()
        self.ctx = ctx or zmq.Context.instance()
        self.node_key = b""
        keys = None
        if config.keys is not None:
            keys = k.ServerKeys.from_dir(config.keys, "master")
            self.node_key = k.load_public(config.keys, "datanode")
        # the port first: a second master started on the same address stops here, before it
        # reads (and might repair the torn tail of) a WAL that the running master writes
        self.router = router if router is not None else \
            RouterServer(self.ctx, config.bind, max_frame_bytes=MAX_REQUEST_BYTES, keys=keys)
        if wal is None:
            private_dir(config.data_dir)  # 0700: blizzard/host/file_modes.py
            wal = Wal(os.path.join(config.data_dir, "wal"), segment_bytes=config.segment_bytes)
        self.wal = wal
        self.state, replayed = recovered or recover(wal)
        claim_shard(self.state, config.shard)  # before ids are handed out
        self.membership = Membership(config.dead_after_s, config.suspect_after_s)
        self.safe_mode = SafeMode(time.monotonic() + config.dead_after_s)
        self.deletes = Deletes()
        self.capabilities = CapabilityKeys(config.data_dir if wal.directory is not None else None,
                                           config.capability_key_s, time.time(),
                                           sign=config.keys is not None)
        self.counts = QueueCounts()  # live events per queue, for the metrics
        self.meta_sync = MetaSync(self.state)  # metadata changes for the nodes, on heartbeats
        self.ids = ItemIds(self.state, self.log_record, config.id_block)
        self.repair = Repairer(self.state, self.membership, config.replication)
        self.id_blocks = Blocks(config, self.ids, self.membership, self.safe_mode, self.deletes,
                                self.capabilities, self._kept_on)
        # who may create queues, with which settings (master/rules/queue_policy.py)
        self.queue_policy = QueuePolicy(config, self.state, self.router.role_of)
        self.enqueues = Enqueues(config, self.state, self.log_record, self.id_blocks, self.deletes,
                                 self.counts, self.queue_policy)
        # sharding: a queue's head here, asked for, told with leases, published
        # (master/shard/heads.py)
        self.heads = Heads(self.state, config.shard, self.ctx, config.heads_bind, keys,
                           lambda: self.wal.records_appended)
        router = self.router
        admitted = router.admitted  # None: security off
        # schedules' runs end in leases and in HTTP delivery (master/consume/schedule_runs.py)
        schedule_runs = ScheduleRuns(self.state, self.log_record)
        self.leases = Leases(config, self.state, self.log_record, self.deletes, self.membership,
                             self.capabilities, self.counts, self.heads,
                             schedule_runs=schedule_runs,
                             progress=Progress(self.state, self.log_record),
                             connection_of=lambda peer: (router.key_of(peer), router.fd_of(peer)),
                             # long polls come with client and admin keys
                             key_admitted=(lambda key: True) if admitted is None else
                             lambda key: admitted.current(f"client:{key}") or
                             admitted.current(f"admin:{key}"))
        # a long poll's slot goes with its connection (blizzard/server/departures.py)
        self.departures = router.departures()
        self.admin = QueueAdmin(config, self.state, self.log_record, self.deletes, self.enqueues,
                                self.leases, self.membership, self.repair, self.safe_mode,
                                self.queue_policy)
        self.datanodes = DatanodeReports(config, self.state, self.log_record, self.membership,
                                         self.repair, self.deletes, self.safe_mode,
                                         self.enqueues, self.capabilities, router.role_of)
        self.tasks = Tasks(self.state, self.log_record, self.counts, schedule_runs)
        self.jobs = JobDesk(self.state, self.log_record, self.leases, self.deletes,
                            connection_of=self.leases.connection_of)
        self.schedules = ScheduleDesk(self.state, self.log_record, self.deletes, self.jobs.status,
                                      self.enqueues)
        self._replies: list[tuple[bytes, int, Any]] = []
        # leases data nodes answer (master/consume/pushes.py)
        self.pushes = Pushes(router.reply)
        self._stopping = False
        self.hold = SyncHold(config.sync_hold_ms / 1000)  # group commit across callers
        # collected always (about a µs a request), served only with a metrics port
        self.metrics = MasterMetrics(config, self.state, wal, counts=self.counts,
                                     enqueues=self.enqueues, leases=self.leases, heads=self.heads,
                                     membership=self.membership, repair=self.repair,
                                     safe_mode=self.safe_mode, pushes=self.pushes,
                                     hold=self.hold)
        # standbys (master/ha/wal_shipping.py): they follow the log; replies wait for a synced one
        caps = self.capabilities
        self.replication = Replication(self.state, wal, self.log_record, self.ctx,
                                       key_ring=lambda: (caps.keys(), caps.rotated_at),
                                       reply=router.reply, send=self.pushes.send,
                                       ids_synced=self.ids.synced, sync=config.sync_standby,
                                       failover_after_s=config.failover_after_s,
                                       keys=k.master_keys(config.keys)[1] if config.keys else None)
        self.checkpoints = Checkpointer(wal, config.checkpoint_records, replayed,
                                        self.metrics.checkpointed,
                                        lambda: 0 if config.keep_wal
                                        else self.replication.keep_from())
        # the cluster id gates heartbeats (master/nodes/cluster_id.py); operator removals
        self.identity = ClusterIdentity(self.state, self.log_record)
        self.removals = Removals(self.state, self.log_record, self.membership, self.safe_mode,
                                 self.repair, self.deletes, self.leases, self.enqueues)
        # a node's key speaks for its own node id only (master/nodes/node_keys.py)
        self.node_keys = NodeKeys(self.state, self.log_record, router.key_of, self._revoked,
                                  self._node_alive)
        # when the loop must pass again; ``stop`` wakes it
        self.wakes = Wakes(timers=[self.leases.next_wake, self.heads.wake, self.heads.next_round,
                                   self.enqueues.next_wake, self.jobs.next_wake,
                                   self.pushes.next_wake,
                                   lambda: _soonest(self.enqueues.expiry),  # staged items
                                   lambda: _soonest(self.id_blocks.expiry)],  # id blocks
                           wall_timers=[self.state.expiries.next_deadline],  # leases
                           busy=self._busy, idle_s=config.dead_after_s / 4,
                           poller=router.poller, also=self.heads.sock)
        self.handlers: dict[type, Handler] = ROUTES.bind(self)  # who serves which op

    # -- requests anyone may send ------------------------------------------------------------

    def ping(self, msg: p.Ping, *_: Any) -> p.Ok:
        return p.Ok()  # answered after the pass's fsync, like every reply

    def hello(self, msg: p.Hello, now: float, mono: float, peer: bytes, rid: int) -> p.Welcome:
        config = self.config
        return p.Welcome(config.keys is not None, self.node_key, self.router.role_of(peer) or "",
                         self.state.epoch, "", config.shard, config.shards, config.heads_bind or "",
                         RELEASE)

    def _busy(self) -> bool:
        """Whether something may change with time alone (the loop then passes often)."""
        replication = self.replication
        return bool(self.leases.waiters or self.repair.scan or self.repair.in_flight
                    or self.safe_mode.on or replication.parked or replication.sync_name
                    or self.checkpoints.child is not None)

    def _revoked(self, key: str) -> bool:
        """True once ``key`` is no data node key of the key directory (removed)."""
        assert self.config.keys is not None
        return secure.guard(self.ctx, self.config.keys).keys.role(key.encode()) != "node"

    def _node_alive(self, node_id: str, mono: float) -> bool:
        node = self.membership.nodes.get(node_id)
        return node is not None and self.membership.is_alive(node, mono)

    def _allowed(self, role: str | None, msg: Any) -> None:
        """Forbidden unless a peer of ``role`` may send ``msg`` (None: security is off).

        Creating a queue is a client's right (as enqueueing to a new one is); changing one is
        an admin's.
        """
        kind = type(msg)
        if role is None or kind in ALLOWED.get(role, ()) or \
                (kind is p.Configure and msg.create and role == "client"):
            return
        who = f"a {role} key" if role else "an unknown key"
        if kind in NODE_OPS:
            raise Forbidden(f"only data nodes may send {kind.__name__}; this is {who}")
        raise Forbidden(f"{who} may not send {kind.__name__}"
                        + ("; it needs an admin key" if kind in ADMIN_OPS else ""))

    def enqueue(self, msg: p.Enqueue, now: float, mono: float, peer: bytes, rid: int) -> Any:
        """With security on, an enqueue must show the grant of the ids' placement: ids are
        sequential, and another client's ids must not be enqueued into this one's queue."""
        if self.router.role_of(peer) is not None:
            self.capabilities.check_owned(msg.grant, msg.ids, self.id_blocks.holds)
        return self.enqueues.enqueue(msg, now, mono, peer, rid)

    def commit(self, msg: p.Commit, now: float, mono: float, peer: bytes, rid: int) -> Any:
        """With security on, a commit must show the grants of its staged ids' placements."""
        if self.router.role_of(peer) is not None:  # (one id in range: the grant is checked)
            self.enqueues.check_stager(
                msg, lambda grant: self.capabilities.check_owned(grant, [grant.first]))
        return self.enqueues.commit(msg, now, mono, peer, rid)

    def set_schedule(self, msg: p.SetSchedule, now: float, mono: float, peer: bytes,
                     rid: int) -> Any:
        """A schedule's call is a staged item: with security on, the grants must show the
        caller staged it, as for a commit."""
        role = self.router.role_of(peer)
        if role is not None:
            self.enqueues.check_stager(
                p.Commit([msg.item], msg.stored_on, "", msg.grants),
                lambda grant: self.capabilities.check_owned(grant, [grant.first]))
        return self.schedules.set(msg, now, may_replace=role in (None, ADMIN))

    # -- data nodes: each request's checks in order, then its collaborator -------------------

    def heartbeat(self, msg: p.Heartbeat, now: float, mono: float, peer: bytes,
                  rid: int) -> p.HeartbeatReply:
        """A data node's heartbeat, step by step: the node's key may speak for its node id
        (``master/nodes/node_keys.py``); a newer epoch the node saw, with the masters' proof, fences
        this master (``master/ha/wal_shipping.py``); the node is of this cluster
        (``master/nodes/cluster_id.py``); it is registered and given its orders
        (``master/nodes/reports.py``). The reply carries this cluster's id, the changed metadata
        of items the node holds (``master/nodes/meta_sync.py``) and this master's epoch with its
        proof.
        """
        self.node_keys.check(msg.node_id, peer, mono)
        self.replication.fence_by(msg)
        self.identity.admit(msg)
        reply = self.datanodes.heartbeat(msg, now, mono, peer, rid)
        reply = p.replace(reply, cluster_id=self.identity.cluster_id)
        return self.replication.stamp(self.meta_sync.add_to(reply, msg.node_id))

    def await_serves(self, msg: p.AwaitServes, now: float, mono: float, peer: bytes,
                     rid: int) -> p.Serves | None:
        """A data node waits for leases to answer itself (``master/consume/pushes.py``)."""
        self.node_keys.check_own(msg.node_id, peer)
        if msg.node_id not in self.state.node_addrs:
            raise InvalidArgument(f"no data node {msg.node_id[:64]!r} is registered here")
        return self.pushes.await_serves(msg, peer, rid)

    def lease(self, msg: p.Lease, now: float, mono: float, peer: bytes,
              rid: int) -> p.Leased | None:
        """A lease (``master/consume/leases.py``); its answer may be pushed by a data node
        (``master/consume/pushes.py``), unless it is a retry: the first answer may have been pushed
        and lost on the way, so a retry's comes from the master."""
        if msg.request not in self.state.recent_leases:
            self.pushes.want(msg, peer, rid)
        return self.leases.lease_request(msg, now, mono, peer, rid)

    def put_report(self, msg: p.PutReport, now: float, mono: float, peer: bytes,
                   rid: int) -> None:
        self.node_keys.check_own(msg.node_id, peer)
        return self.id_blocks.report(msg, now, mono, peer, rid)

    def replicated(self, msg: p.Replicated, now: float, mono: float, peer: bytes,
                   rid: int) -> p.Ok:
        self.node_keys.check_own(msg.node_id, peer)
        return self.datanodes.replicated(msg, now, mono, peer, rid)

    def inventory(self, msg: p.Inventory, now: float, mono: float, peer: bytes,
                  rid: int) -> p.Ok:
        self.node_keys.check_own(msg.node_id, peer)
        return self.datanodes.inventory(msg, now, mono, peer, rid)

    def _kept_on(self, item_id: int) -> tuple[str, ...] | None:
        """The nodes the master counts an id's blob on: an item's replicas, a staged item's
        holders; None for an id it keeps nowhere."""
        item = self.state.items.get(item_id)
        if item is not None:
            return item.nodes
        batch = self.enqueues.pending.get(item_id)
        return batch.nodes if batch is not None else None

    # -- durable state -----------------------------------------------------------------------

    def log_record(self, rec: Any) -> None:
        """Change durable state: append the record to the WAL, then apply it.

        In this order, so a record that cannot be logged (``RecordTooLarge``) changes nothing;
        the pass's fsync comes before any reply, so nothing applied here is revealed early.
        """
        self.wal.append(records.pack(rec))
        self.state.apply(rec)
        self.meta_sync.saw(rec)

    # -- checkpoints -------------------------------------------------------------------------

    def _maybe_checkpoint(self) -> None:
        self.checkpoints.poll()
        if self.checkpoints.due():  # everything before the new segment is in the state
            self.checkpoints.roll_and_fork(self.state)

    # -- loop --------------------------------------------------------------------------------

    def serve_forever(self) -> None:
        log.info("master serving on %s (data dir %s, R=%d, W=%d)", self.config.bind,
                 self.config.data_dir, self.config.replication, self.config.min_replicas)
        if self.config.keys is None:
            log.warning("SECURITY IS OFF (--insecure): anyone who reaches %s may do anything",
                        self.config.bind)
        else:
            log.info("security on: CURVE keys from %s", self.config.keys)
        if self.wal.directory is not None:  # a data dir of its own: say it serves there
            ready_file.write(self.config.data_dir, pid=os.getpid(), addr=self.config.addr,
                             cluster_id=self.identity.cluster_id)
        while not self._stopping:
            self.run_once()

    def stop(self) -> None:
        self._stopping = True
        self.wakes.interrupt()

    def close(self) -> None:
        if self.wal.directory is not None:
            ready_file.remove(self.config.data_dir)
        if self.departures is not None:
            self.departures.close()  # before its socket (see Departures)
        self.router.close()
        self.heads.close()
        self.wakes.close()
        self.metrics.close()
        try:
            self.checkpoints.now(self.state)
        except OSError as exc:
            log.critical("final checkpoint failed: %s", exc)
            os._exit(70)
        self.wal.close()

    def run_once(self, timeout_ms: int | None = None) -> None:
        """One pass: the requests that came (waiting for one until a timer is due, at most
        ``timeout_ms``), the timers, one fsync, the replies."""
        mono = time.monotonic()
        wait_ms = max(0, int((self.wakes.next_pass(time.time(), mono) - mono) * 1000) + 1)
        requests = self.router.receive(wait_ms if timeout_ms is None else min(wait_ms, timeout_ms))
        if self.departures is not None:  # after the batch came, before it is handled: see there
            self._drop_departed(self.departures.read())
        now, mono = time.time(), time.monotonic()
        try:
            self.schedules.skip_missed(now)  # once, before any lease: ticks missed while down
        except Exception:  # a bug here must not stop the master; the ticks then run late
            log.exception("internal error skipping the schedules' missed ticks")
        callers = self._handle_all(requests, now, mono)
        self.pushes.flush()  # leases answered before the fsync may be a data node's to answer
        self._tick(now, mono)
        if requests and self.wal.dirty:
            # the clients waiting on this pass's fsync: their requests logged something, or
            # their answers wait (an enqueue the pass's reports completed, say)
            waiting = callers | {peer for peer, _, _ in self._replies}
            self.hold.saw(waiting, mono)
            if self.hold.should_hold(waiting, mono):
                now, mono = self._hold(now, mono)
                self._tick(now, mono)
        self.wal.flush()  # group commit: one fsync for the whole pass, before any reply
        replies, self._replies = self._replies, []
        # heads first: a producer told its item is in should find subscribers told too
        self.heads.publish(bool(requests or replies), mono)
        self.replication.release(replies)  # at once, or when a sync standby holds the pass
        self.pushes.flush()  # the leases data nodes answer: their orders (master/consume/pushes.py)
        self.replication.serve_parked(mono)
        self._maybe_checkpoint()

    def _handle_all(self, requests: list[tuple[bytes, int, Any]], now: float,
                    mono: float) -> set[bytes]:
        """Handle ``requests``; the clients among them whose requests logged something (a
        data node's reports not counted: ``SyncHold`` counts the clients)."""
        timed = self.metrics.request
        callers: set[bytes] = set()
        for peer, rid, msg in requests:
            logged = self.wal.records_appended
            started = perf_counter()
            reply = self.handle(peer, rid, msg, now, mono)
            kind = type(msg)
            timed(kind, perf_counter() - started)
            if self.wal.records_appended > logged and kind not in NODE_OPS:
                callers.add(peer)
            if reply is None:
                continue
            if self._answer_now(msg, reply, logged):
                self.pushes.send(peer, rid, reply)
            else:
                self._replies.append((peer, rid, reply))
        return callers

    def _drop_departed(self, fds: set[int]) -> None:
        """The long polls and job waits of connections that ended go with them."""
        self.leases.drop_departed(fds)
        self.jobs.drop_departed(fds)

    def _tick(self, now: float, mono: float) -> None:
        try:
            self.tick(now, mono)
        except Exception:  # a bug in a timer must not stop the server; it is retried next pass
            log.exception("internal error in the master's timers")

    def _hold(self, now: float, mono: float) -> tuple[float, float]:
        """Take what comes within the hold window into this pass, before its fsync, while many
        callers are busy (``SyncHold``); the pass's (wall, monotonic) time after it."""
        deadline = mono + self.hold.window_s
        while (left := deadline - time.monotonic()) > 0:
            more = self.router.receive(max(1, int(left * 1000)))
            if not more:
                break
            now, mono = time.time(), time.monotonic()
            if self.departures is not None:
                self._drop_departed(self.departures.read())
            self.hold.saw(self._handle_all(more, now, mono), mono)
        return now, mono

    def _answer_now(self, msg: Any, reply: Any, logged: int) -> bool:
        """Whether a reply may go out before the pass's fsync (and the sync standby's).

        A standby's ``Follow`` and a ``Hello`` (a client's sign of life) reveal nothing, and a
        heartbeat reply with no delete orders neither (its delete orders may stem from acks
        not yet durable): a data node must not leave a primary that waits for its standby.
        Without a sync standby, a placement that logged nothing, whose ids lie below a
        reservation already on disk, reveals nothing the fsync could still lose; and a lease
        without acks riding on it may be answered early too: if the master dies before the
        fsync, the lease is forgotten and the item is handed out again (at least once, P2)
        without that attempt counted.
        """
        kind = type(msg)
        if kind is p.Follow or kind is p.Hello or kind is p.AwaitServes or \
                (kind is p.Heartbeat and isinstance(reply, p.HeartbeatReply) and not reply.delete):
            return True
        if self.replication.sync_name:
            return False
        if kind is p.Lease:
            return not msg.ack_ids
        return kind is p.Place and self.wal.records_appended == logged and self.ids.all_durable()

    def handle(self, peer: bytes, rid: int, msg: Any, now: float, mono: float) -> Any:
        """One request's reply (None: a long poll parked); a failure costs this request only."""
        handler = self.handlers.get(type(msg))
        try:
            if handler is None:
                raise InvalidArgument(f"the master does not serve {p.op_name(msg)}")
            self._allowed(self.router.role_of(peer), msg)
            return handler(msg, now, mono, peer, rid)
        except BlizzardError as exc:
            return error_reply(exc)
        except Exception as exc:  # a bug must cost one request, never the server
            log.exception("internal error handling %s", p.op_name(msg))
            return p.Error("internal", f"internal error: {type(exc).__name__}: {str(exc)[:200]}")

    # -- timers ------------------------------------------------------------------------------

    def tick(self, now: float, mono: float) -> None:
        self.leases.expire(now)
        self.pushes.expire()
        self.enqueues.expire(mono)
        self._replies += self.enqueues.serve_waiting(now, mono)
        self._replies += self.leases.serve_waiters(now, mono)
        self.jobs.expire_results(now, mono)
        self._replies += self.jobs.serve_waiters(now, mono)
        self.datanodes.watch(mono)
        self.capabilities.tick(now)
        self.replication.watch(mono)
