"""A data node: serves PUT/GET/DELETE of blobs, forwards copies to replicas, heartbeats.

Each ``run_once`` pass drains the waiting requests; every Put in the pass goes into one
``WriteBatch(sync=True)``, and only after it is durable are replies, reports or forwards
sent. A producer's Put carries ``report``: its ids go to the master in one ``PutReport``
per pass (the master completes the producer's enqueue), and the producer gets no reply. A
Put that names replicas (a copy the master ordered) is answered once ``min_replicas`` nodes,
this one included, hold every blob.

A secure node serves only requests with the master's grant, or relays (``datanode/grants.py``).
``ROUTES`` below says which request each handler serves and who may send it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
import zlib
from typing import Any

import plyvel
import zmq

from blizzard.host.fd_limits import is_fd_pressure
from blizzard.host.file_modes import private_dir
from blizzard.host.log_limit import Throttled
from blizzard.net import keys as k
from blizzard.net.addrs import check_addr
from blizzard.net.transport import Endpoint
from blizzard.server.registry import ROLES, Route, Routes
from blizzard.server.router import RouterServer, error_reply
from blizzard.server.sync_hold import SyncHold
from blizzard.server.wake_pipe import WakePipe
from blizzard.wire import protocol as p
from blizzard.wire.errors import (
    BlizzardError,
    InvalidArgument,
    PayloadTooLarge,
    StorageError,
    WrongNode,
)
from datanode import meta
from datanode.cluster_id import ClusterMembership
from datanode.config import DatanodeConfig, load_node_id
from datanode.grants import DELETERS, Gate
from datanode.leader import Leader
from datanode.metrics import DatanodeMetrics
from datanode.reads import read
from datanode.replica_waits import Refusals, ReplicaWait
from datanode.serves import Serving
from datanode.store import BlobStore, LevelDbStore, is_disk_full

log = logging.getLogger(__name__)

FORWARD_TIMEOUT_S = 3.0  # below the client's node timeout, so a partial result still arrives
MAX_PEERS = 64  # connections to other data nodes kept open; the least recently used goes
MAX_FORWARD = 16  # replicas one put may name
RETRY_S = 0.2  # the next heartbeat after a standby's refusal: it may be the primary any moment
REOPEN_S = 10.0  # a store that failed for want of descriptors is reopened this often at most

# Every request a data node serves: its handler, and who may send it with security on. Puts
# and gets are any key's that shows the master's grant (a data node relays puts without one):
# the grant decides, not the role (``datanode/grants.py``); the roles that may list metadata
# and delete are checked where those requests are served (``meta.page``, ``Gate``). A data
# node logs no records: its store is its state.
ROUTES = Routes([
    #     op           handler       who may send
    Route(p.Put,       "put",        ROLES),  # stored with the pass's other puts (``_write``)
    Route(p.Get,       "get",        ROLES),
    Route(p.ListMeta,  "list_meta",  meta.READERS),  # a rebuilding master's (master/ha/rebuild.py)
    Route(p.Delete,    "delete",     DELETERS),
])


@dataclasses.dataclass
class Pass:
    """What one pass's requests leave for its one synced write of puts."""

    started: float  # when the pass took its requests up (``perf_counter``)
    puts: list[tuple[bytes, int, p.Put]] = dataclasses.field(default_factory=list)
    refused: Refusals = dataclasses.field(default_factory=Refusals)  # reported puts refused
    # ids of granted puts stored here before: reported stored again, not rewritten
    again: list[int] = dataclasses.field(default_factory=list)


class DatanodeServer:
    """One data node process; ``store`` may be given (e.g. a ``MemoryStore`` in tests)."""

    def __init__(self, config: DatanodeConfig, ctx: zmq.Context | None = None, *,
                 store: BlobStore | None = None) -> None:
        self.config = config.validate()
        self.ctx = ctx or zmq.Context.instance()
        private_dir(config.data_dir)  # 0700: blizzard/host/file_modes.py
        self.node_id = load_node_id(config.data_dir)
        self.addr = config.advertise or config.bind
        self.store = store if store is not None else \
            LevelDbStore(os.path.join(config.data_dir, "blobs"))
        # obeys only a master of its cluster
        self.cluster = ClusterMembership(self.store, config.join_cluster)
        server_keys: k.ServerKeys | None
        self.keys: k.ClientKeys | None
        server_keys, self.keys = k.node_keys(config.keys, config.node_key) \
            if config.keys else (None, None)
        self.router = RouterServer(self.ctx, config.bind, keys=server_keys, pushes=True)
        self.leader = Leader(self.ctx, config.master, self.keys)  # the primary, by epoch
        self.gate = Gate(self.node_id, self.router.role_of) if config.keys is not None else None
        self.peers: dict[str, Endpoint] = {}
        self._polled: tuple[zmq.Poller, dict[zmq.Socket, Endpoint]] = (zmq.Poller(), {})
        # forward request id -> the write waiting on it
        self.replica_waits: dict[int, ReplicaWait] = {}
        self.hold = SyncHold(config.sync_hold_ms / 1000)  # group commit across producers
        self.next_heartbeat = 0.0
        self.heartbeat_rid: int | None = None
        self._stopping = False
        self.wake = WakePipe()  # ``stop`` wakes the loop's sleep
        self.metrics = DatanodeMetrics(self)  # timings always; served with a metrics port
        self.pressure = Throttled(log)  # out of file descriptors: a line now and then
        self.reopen_at = 0.0  # monotonic: the store may be reopened from then on
        # ids stored by copies from peers -> when: told to the master ``copy_confirm_s`` after,
        # when the copy's source has reported it (``Replicated``) and the master keeps it; a
        # blob nobody ordered (a node key's planted put) is a stray the master deletes
        self.copied: dict[int, float] = {}
        self.handlers = ROUTES.bind(self)  # who serves which op
        # leases answered here on the master's order (datanode/serves.py)
        self.serving = Serving(self.node_id, self.store, self.router, self.metrics.since)

    @property
    def master(self) -> Endpoint:
        return self.leader.endpoint

    # -- loop --------------------------------------------------------------------------------

    def serve_forever(self) -> None:
        log.info("data node %s serving on %s (master %s, cluster %s)", self.node_id, self.addr,
                 self.config.master, self.cluster.cluster_id or "none yet")
        if self.keys is None:
            log.warning("SECURITY IS OFF (--insecure): anyone who reaches %s may read and "
                        "write blobs", self.addr)
        while not self._stopping:
            self.run_once()

    def stop(self) -> None:
        self._stopping = True
        self.wake.wake()

    def close(self) -> None:
        self.router.close()
        self.wake.close()
        self.metrics.close()
        self.leader.close()
        for ep in self.peers.values():
            ep.close()
        self.store.close()

    def _poller(self) -> tuple[zmq.Poller, dict[zmq.Socket, Endpoint]]:
        """The poller over our sockets, rebuilt only when a socket was replaced or added.

        With no descriptor for a new socket, the sockets open now: the node serves on, and a
        later pass opens the rest.
        """
        endpoints = [self.master, *self.peers.values()]
        try:
            dealers = {ep.open_socket(): ep for ep in endpoints}
        except zmq.ZMQError as exc:
            if not is_fd_pressure(exc):
                raise
            self.pressure("socket", "no file descriptor for a new socket (%s): serving on, "
                          "retrying", exc)
            dealers = {ep.sock: ep for ep in endpoints if ep.sock is not None}
        if dealers.keys() != self._polled[1].keys():
            poller = zmq.Poller()
            poller.register(self.router.sock, zmq.POLLIN)
            self.wake.watch_with(poller)
            for sock in dealers:
                poller.register(sock, zmq.POLLIN)
            self._polled = (poller, dealers)
        return self._polled

    def run_once(self, timeout_ms: int | None = None) -> None:
        """One pass: what came (waiting ``wait_ms`` for it), expired replica waits, a heartbeat
        if due."""
        poller, dealers = self._poller()
        ready = dict(poller.poll(self.wait_ms(timeout_ms)))
        for sock, ep in dealers.items():
            if sock in ready and ep.sock is sock:  # not a peer evicted earlier in this pass
                self._guarded(ep.read_ready)
                self._guarded(self._collect, ep)
        if self.router.sock in ready:
            self._handle(self.router.receive(0, ready=True))
        now = time.monotonic()
        self._guarded(self.serving.ask, self.master, now)
        self._guarded(self._expire_jobs, now)
        if now >= self.next_heartbeat:
            self._guarded(self._heartbeat, now)
            self._guarded(self._confirm_copies, now)

    def wait_ms(self, timeout_ms: int | None = None) -> int:
        """How long a pass waits for a request or reply: until the next heartbeat or the first
        forwarded copy runs out, ``timeout_ms`` at most. An idle node does not pass every 50 ms
        (a pass after a sleep costs ~300 µs of cold caches). Jobs all wait
        ``FORWARD_TIMEOUT_S``, so the oldest (first in ``replica_waits``) runs out first."""
        due = self.next_heartbeat
        if self.replica_waits:
            due = min(due, next(iter(self.replica_waits.values())).deadline)
        wait = max(0, int((due - time.monotonic()) * 1000) + 1)
        return wait if timeout_ms is None else min(wait, timeout_ms)

    def _guarded(self, step: Any, *args: Any) -> None:
        """Run one step of the loop; a bug in it is logged, never the end of the node (P7)."""
        try:
            step(*args)
        except Exception:
            log.exception("internal error in %s", getattr(step, "__name__", step))

    # -- requests ----------------------------------------------------------------------------

    def _handle(self, requests: list[tuple[bytes, int, Any]]) -> None:
        """Each request to its handler, which replies (a put: after the pass's write). While
        many producers are busy, what comes within the hold window joins the pass's write
        (``SyncHold``): one sync and one report to the master for all of it."""
        batch = Pass(time.perf_counter())
        self._dispatch(requests, batch)
        producers = {peer for peer, _, _ in batch.puts}
        if producers:
            now = time.monotonic()
            self.hold.saw(producers, now)
            if self.hold.should_hold(producers, now):
                deadline = now + self.hold.window_s
                while (left := deadline - time.monotonic()) > 0:
                    more = self.router.receive(max(1, int(left * 1000)))
                    if not more:
                        break
                    seen = len(batch.puts)
                    self._dispatch(more, batch)
                    self.hold.saw({peer for peer, _, _ in batch.puts[seen:]}, time.monotonic())
        if batch.puts:  # reports the pass's puts, refused ones too
            self._write(batch.puts, batch.refused, batch.started, batch.again)
        else:
            self._send_report(batch.again, batch.refused)

    def _dispatch(self, requests: list[tuple[bytes, int, Any]], batch: Pass) -> None:
        for peer, rid, msg in requests:
            handler = self.handlers.get(type(msg))
            try:
                if handler is None:
                    raise InvalidArgument(f"a data node does not serve {p.op_name(msg)}")
                handler(msg, peer, rid, batch)
            except BlizzardError as exc:
                self.router.reply(peer, rid, error_reply(exc))
            except Exception as exc:  # a bug must cost one request, never the node (P7)
                log.exception("internal error handling %s", p.op_name(msg))
                self.router.reply(peer, rid, p.Error("internal", f"internal error: "
                                                     f"{type(exc).__name__}: {str(exc)[:200]}"))

    def put(self, msg: p.Put, peer: bytes, rid: int, batch: Pass) -> None:
        """Checked now, written with the pass's other puts; a put with ``report`` that fails
        its checks is refused to the master (the producer gets no reply)."""
        try:
            self._check_put(msg, peer)
        except BlizzardError as exc:
            if not msg.report or len(msg.ids) > p.MAX_BATCH:
                raise
            batch.refused.add(msg.ids, exc.message)
            return
        if msg.grant is not None and msg.report and \
                self._stored_before(msg, batch.again, batch.refused):
            return
        batch.puts.append((peer, rid, msg))

    def get(self, msg: p.Get, peer: bytes, rid: int, batch: Pass) -> None:
        self.router.reply(peer, rid, read(self.store, msg, self.gate, peer))
        self.metrics.since("get", batch.started)

    def list_meta(self, msg: p.ListMeta, peer: bytes, rid: int, batch: Pass) -> None:
        self.router.reply(peer, rid, meta.page(
            self.store, msg, self.node_id, self.addr, self.cluster.cluster_id,
            (lambda: self.router.role_of(peer)) if self.gate is not None else None))

    def delete(self, msg: p.Delete, peer: bytes, rid: int, batch: Pass) -> None:
        if len(msg.ids) > p.MAX_BATCH:
            raise InvalidArgument("a delete takes at most 10000 ids")
        if self.gate is not None:
            self.gate.check_delete(msg, peer)
        self.store.delete_many(msg.ids)
        self.router.reply(peer, rid, p.Ok())
        self.metrics.since("delete", batch.started)

    def _stored_before(self, msg: p.Put, again: list[int], refused: Refusals) -> bool:
        """True if a granted put names ids this node holds already: a retry (every id here)
        is reported stored again, anything else refused; neither replaces a blob, so a put
        grant cannot rewrite an item once it is enqueued."""
        if min(msg.ids) >= self.store.id_hi:  # ids only grow: the usual put ends here
            return False
        found = self.store.get_many(msg.ids)
        held = [i for i, f in zip(msg.ids, found, strict=True) if f is not None]
        if not held:
            return False
        if len(held) == len(msg.ids):
            again += held
        else:
            refused.add(msg.ids, f"{self.node_id}: {len(held)} of these ids are stored here "
                        "already; a put never replaces a blob")
        return True

    def _not_held(self, msg: p.Put) -> list[int] | None:
        """For a put without a grant (a copy from a peer): the positions of the ids this node
        does not hold intact, the only ones it writes (None: all of them). A blob held intact
        is never replaced, so a node's key cannot rewrite the replicas of an item on other
        nodes; a damaged one (failing its checksum) is, which is what a repair's copy is for.
        A granted put never gets here with a held id (``_stored_before``)."""
        if msg.grant is not None or min(msg.ids) >= self.store.id_hi:  # ids only grow
            return None
        return [k for k, found in enumerate(self.store.get_many(msg.ids)) if found is None]

    def _check_put(self, msg: p.Put, peer: bytes) -> None:
        if msg.node_id and msg.node_id != self.node_id:
            raise WrongNode(f"this is {self.node_id}, not {msg.node_id} (a node that was "
                            "replaced at the same address)")
        n = len(msg.ids)
        if not (n == len(msg.blobs) == len(msg.crcs)) or n == 0 or n > p.MAX_BATCH:
            raise InvalidArgument("a put needs 1..10000 ids with as many blobs and checksums")
        if len(msg.forward) > MAX_FORWARD:
            raise InvalidArgument(f"a put names at most {MAX_FORWARD} replicas")
        if msg.report and msg.forward:
            raise InvalidArgument("a put reported to the master forwards to no replica")
        if not 1 <= msg.min_replicas <= 1 + len(msg.forward):
            raise InvalidArgument("min_replicas must be between 1 and the number of replicas")
        for ref in msg.forward:
            check_addr(ref.addr)
        if self.gate is not None:
            self.gate.check_put(msg, peer)
        meta.check_put(msg)
        for blob, crc in zip(msg.blobs, msg.crcs, strict=True):
            if len(blob) > self.config.max_item_bytes:
                raise PayloadTooLarge(f"a blob of {len(blob)} bytes exceeds max-item-bytes "
                                      f"{self.config.max_item_bytes}")
            if zlib.crc32(blob) != crc:
                raise InvalidArgument("a blob does not match its checksum (damaged in transit?)")

    def _write(self, puts: list[tuple[bytes, int, p.Put]], refused: Refusals,
               started: float, again: list[int]) -> None:
        """One synced ``WriteBatch`` for every put of the pass, then the replies and reports."""
        ids, blobs, crcs, metas = [], [], [], []  # metas: each id's (None: none given)
        for _, _, msg in puts:
            kept = self._not_held(msg)
            if kept is None:
                ids += msg.ids
                blobs += msg.blobs
                crcs += msg.crcs
                metas += meta.for_put(msg) or [None] * len(msg.ids)
                continue
            put_metas = meta.for_put(msg) or [None] * len(msg.ids)
            ids += [msg.ids[k] for k in kept]
            blobs += [msg.blobs[k] for k in kept]
            crcs += [msg.crcs[k] for k in kept]
            metas += [put_metas[k] for k in kept]
        began = time.perf_counter()
        try:
            if ids:  # (every id of the pass's copies may be held already)
                self.store.put_many(ids, blobs, crcs, metas)
        except (OSError, plyvel.Error) as exc:  # the disk, not the request (P6)
            pressure = is_fd_pressure(exc)  # out of descriptors: refused now, retried later
            if pressure:
                self.pressure("write", "write of %d blobs failed for want of file descriptors "
                              "(%s): refused, the store is reopened", len(ids), exc)
            else:
                log.error("write of %d blobs failed: %s", len(ids), exc)
            error = StorageError(f"{self.node_id}: {exc}")
            for peer, rid, msg in puts:
                if msg.report:
                    refused.add(msg.ids, error.message)
                else:
                    self.router.reply(peer, rid, error_reply(error))
            if pressure:
                self._send_report([], refused)
                self._reopen_store()
            elif not is_disk_full(exc):  # a full disk: refused, reads go on
                self._send_report([], refused)
                log.critical("storage error that is not a full disk; stopping")
                os._exit(70)
            return
        self.metrics.wrote(len(puts), started, began)
        reported: list[int] = list(again)
        if ids:
            granted = {i for _, _, msg in puts if msg.grant is not None for i in msg.ids}
            stored_at = time.monotonic()
            for item_id in ids:
                if item_id not in granted:  # a copy: told to the master later
                    self.copied[item_id] = stored_at
        for peer, rid, msg in puts:
            if msg.report:
                reported += msg.ids
            elif not msg.forward:
                self.router.reply(peer, rid, p.Stored([self.node_id]))
            else:
                wait = ReplicaWait(peer, rid, msg.min_replicas,
                                   time.monotonic() + FORWARD_TIMEOUT_S, [self.node_id])
                self._forward(wait, msg, msg.forward)
        self._send_report(reported, refused)

    def _reopen_store(self) -> None:
        """Open the store again (see ``LevelDbStore.reopen``), at most every ``REOPEN_S``."""
        now = time.monotonic()
        if now < self.reopen_at:
            return
        self.reopen_at = now + REOPEN_S
        try:
            self.store.reopen()
            log.info("store reopened after running out of file descriptors")
        except (OSError, plyvel.Error) as exc:
            self.pressure("reopen", "cannot reopen the store yet: %s", exc)

    def _send_report(self, stored: list[int], refused: Refusals) -> None:
        """Tell the master which reported puts of this pass are durable and which were refused."""
        for start in range(0, len(stored), p.MAX_BATCH):
            self._report(p.PutReport(self.node_id, stored[start:start + p.MAX_BATCH], [], ""))
        for error, ids in refused.by_error.items():
            for start in range(0, len(ids), p.MAX_BATCH):
                self._report(p.PutReport(self.node_id, [], ids[start:start + p.MAX_BATCH], error))
        refused.by_error.clear()

    def _forward(self, wait: ReplicaWait, put: p.Put, targets: list[p.NodeRef]) -> None:
        for ref in targets:
            relay = p.Put(put.ids, put.blobs, put.crcs, [], 1, ref.node_id, False, None, put.meta)
            try:
                fid = self._peer(ref.addr).send(relay)
            except (TimeoutError, InvalidArgument) as exc:
                log.warning("cannot forward to %s: %s", ref.addr[:80], exc)
                continue
            wait.waiting.add(fid)
            self.replica_waits[fid] = wait
        self._maybe_finish(wait)

    def _peer(self, addr: str) -> Endpoint:
        """The connection to another data node; past ``MAX_PEERS`` the least recently used
        closes."""
        ep = self.peers.pop(addr, None)
        if ep is None:
            if len(self.peers) >= MAX_PEERS:
                oldest = next(iter(self.peers))
                self.peers.pop(oldest).close()  # its forwards still waiting time out
            ep = Endpoint(self.ctx, addr, self.keys, self.keys.datanode if self.keys else None)
        self.peers[addr] = ep  # (re)inserted last: dicts keep insertion order
        return ep

    def _collect(self, ep: Endpoint) -> None:
        for fid in [f for f in ep.received() if f in self.replica_waits]:
            reply = ep.take(fid)
            wait = self.replica_waits.pop(fid)
            wait.waiting.discard(fid)
            if isinstance(reply, p.Stored):
                wait.stored += [n for n in reply.nodes if n not in wait.stored]
            else:
                log.warning("replica %s refused a forwarded put: %s", ep.addr, reply)
            self._maybe_finish(wait)
        if ep is self.master:
            self.serving.collect(ep, time.monotonic())  # leases to answer (datanode/serves.py)
            reply = ep.take(self.heartbeat_rid) if self.heartbeat_rid is not None else None
            ep.discard_received()  # replies to reports need no action
            if reply is not None:
                self.heartbeat_rid = None
                if not self.leader.accepts(reply):  # a standby: ask again soon
                    self.next_heartbeat = min(self.next_heartbeat, time.monotonic() + RETRY_S)
                elif self.cluster.accepts(reply):
                    self.leader.learn(reply)
                    self._obey(reply)
                    self.serving.not_before = 0.0  # registered: orders may come now

    def _obey(self, reply: p.HeartbeatReply) -> None:
        """Carry out the master's commands from a heartbeat reply; learn its capability keys."""
        if self.gate is not None:
            self.gate.learn(reply.keys)
        meta.update(self.store, reply.meta)  # changes the master made (attempts, dead letters)
        if reply.delete:
            self.store.delete_many(reply.delete)
            log.debug("deleted %d blobs on the master's word", len(reply.delete))
        for order in reply.copies:
            self._guarded(self._copy, order)
        if reply.inventory:
            ids = list(self.store.ids())
            for start in range(0, max(1, len(ids)), p.MAX_BATCH):
                chunk = ids[start:start + p.MAX_BATCH]
                self._report(p.Inventory(self.node_id, chunk, start + p.MAX_BATCH >= len(ids)))

    def _copy(self, order: p.CopyOrder) -> None:
        """Copy blobs to another node, as the master ordered; report what was confirmed."""
        found = self.store.get_many(order.ids)
        ids = [i for i, f in zip(order.ids, found, strict=True) if f is not None]
        missing = [i for i, f in zip(order.ids, found, strict=True) if f is None]
        report = p.Replicated(self.node_id, order.target.node_id, ids, missing)
        if not ids:
            self._report(report)
            return
        wait = ReplicaWait(None, 0, 2, time.monotonic() + FORWARD_TIMEOUT_S, [self.node_id],
                           copy=report)
        relay = p.Put(ids, [f[0] for f in found if f is not None],
                      [f[1] for f in found if f is not None], [], 1, "", False, None,
                      meta.for_copy(self.store, ids))
        self._forward(wait, relay, [order.target])

    def _report(self, msg: object) -> None:
        try:
            self.master.send(msg)
        except TimeoutError:
            log.warning("could not report %s to the master", p.op_name(msg))

    def _maybe_finish(self, wait: ReplicaWait, timed_out: bool = False) -> None:
        if wait.done or not (len(wait.stored) >= wait.needed or not wait.waiting or timed_out):
            return
        wait.done = True
        if wait.copy is not None:
            if len(wait.stored) >= wait.needed:
                self._report(wait.copy)
            else:
                log.warning("copy of %d blobs to %s failed", len(wait.copy.ids), wait.copy.target)
        elif wait.peer is not None:
            # Report who stored the blobs; the client decides whether that is enough.
            self.router.reply(wait.peer, wait.rid, p.Stored(wait.stored))

    def _expire_jobs(self, now: float) -> None:
        for fid, wait in list(self.replica_waits.items()):
            if wait.deadline <= now:
                del self.replica_waits[fid]
                wait.waiting.discard(fid)
                self._maybe_finish(wait, timed_out=True)

    # -- heartbeats --------------------------------------------------------------------------

    def _confirm_copies(self, now: float) -> None:
        """Report the ids copies stored ``copy_confirm_s`` ago: the master keeps those it
        counts here and orders the rest deleted, so every stored id is reported in a bound."""
        if not self.copied:
            return
        due = [i for i, at in self.copied.items() if now - at >= self.config.copy_confirm_s]
        for item_id in due:
            del self.copied[item_id]
        for start in range(0, len(due), p.MAX_BATCH):
            self._report(p.PutReport(self.node_id, due[start:start + p.MAX_BATCH], [], ""))

    def _heartbeat(self, now: float) -> None:
        self.next_heartbeat = now + self.config.heartbeat_s
        for peer in self.peers.values():  # read their handshake events: unread, they pile up
            peer.handshake_failure()
        refused = self.master.handshake_failure()
        if self.heartbeat_rid is not None:  # the last one went unanswered: master gone?
            if refused is not None:
                log.error("the master refuses this node: %s", refused)
            self.leader.silent()
            self.heartbeat_rid = None
        free = shutil.disk_usage(self.config.data_dir).free
        try:
            self.heartbeat_rid = self.master.send(p.Heartbeat(
                self.node_id, self.addr, self.store.count, self.store.bytes_used, free,
                self.cluster.cluster_id, self.leader.epoch, self.leader.epoch_proof))
        except TimeoutError:
            self.heartbeat_rid = None
