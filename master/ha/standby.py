"""A hot standby master: it follows the primary's WAL and becomes the primary when told to, or
when the primary it is in sync with falls silent.

The standby's data dir mirrors the primary's: the same WAL segments, byte for byte (written
and fsynced before the next ``Follow`` acknowledges them), and checkpoints of its own, taken
where the primary rolled its log. It applies every record to its own state as it arrives,
so promotion is immediate: the state, the log and the serving socket are handed to a
``MasterServer``, which logs ``EpochBegun`` (epoch + 1) before it answers anything. Until
then it answers ``NotPrimary`` (naming the primary), ``Hello`` (with its epoch), and
``Promote`` (an admin's).

A standby that has no log, or one of another epoch (a former primary coming back), is sent
the primary's newest checkpoint and starts over from it (``master/ha/wal_shipping.py``).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import zmq

from blizzard.host.file_modes import private_dir
from blizzard.net import keys as k
from blizzard.net.transport import Endpoint
from blizzard.server.router import RouterServer, error_reply
from blizzard.wire import protocol as p
from blizzard.wire.errors import BlizzardError, Forbidden, InvalidArgument, NotPrimary
from blizzard.wire.release import RELEASE
from master.config import MasterConfig
from master.log import checkpoint_file
from master.log.recovery import Checkpointer, recover
from master.log.wal import Wal, WalCorrupt, scan
from master.nodes.grant_keys import CapabilityKeys
from master.state import records
from master.state.machine import State
from master.state.records import EpochBegun

log = logging.getLogger(__name__)

RESEND_S = 1.0  # a Follow unanswered this long is sent again (the primary parks it 0.25 s)


class StandbyServer:
    """One standby master process; ``promote`` turns it into a ``MasterServer`` in place."""

    def __init__(self, config: MasterConfig, ctx: zmq.Context | None = None) -> None:
        assert config.standby_of is not None
        self.config = config.validate()
        self.ctx = ctx or zmq.Context.instance()
        server_keys: k.ServerKeys | None
        self.keys: k.ClientKeys | None
        server_keys, self.keys = k.master_keys(config.keys) if config.keys else (None, None)
        self.node_key = k.load_public(config.keys, "datanode") if config.keys else b""
        from master.server import MAX_REQUEST_BYTES
        self.router = RouterServer(self.ctx, config.bind, max_frame_bytes=MAX_REQUEST_BYTES,
                                   keys=server_keys)
        private_dir(config.data_dir)  # 0700: blizzard/host/file_modes.py
        self.wal = Wal(os.path.join(config.data_dir, "wal"), segment_bytes=config.segment_bytes)
        self.wal.rolls = False  # it rolls where the primary did
        self.state, replayed = recover(self.wal)
        self.checkpoints = Checkpointer(self.wal, config.checkpoint_records, replayed)
        self.capabilities = CapabilityKeys(config.data_dir, config.capability_key_s, time.time())
        self.primary_addr: str = config.standby_of  # the primary, as a Hello is told it
        self.primary = Endpoint(self.ctx, config.standby_of, self.keys,
                                self.keys.master if self.keys else None)
        self.rid: int | None = None
        self.sent = 0.0  # monotonic time the outstanding Follow went out
        self.heard = time.monotonic()  # the primary's last answer
        self.snapshot: tuple[int, int] | None = None  # (wal_start, bytes received) in a snapshot
        # the primary's epoch whose log this one is a prefix of (-1: none, send a snapshot)
        self.epoch = self.state.epoch if self.state.cluster_id else -1
        self.promoting: list[tuple[bytes, int]] = []  # Promote requests to answer once done
        self.caught_up = False  # reached the primary's end since it started (over)
        self.master: Any = None  # the MasterServer once promoted
        self._stopping = False

    @property
    def synced(self) -> bool:
        """The primary's log says replies wait for this standby, and it has caught up since it
        (re)started: it holds everything they confirmed. (A log or checkpoint naming it says
        nothing of what the primary confirmed while it was away or behind.)"""
        return self.caught_up and self.state.standby[0] == self.config.addr

    # -- loop --------------------------------------------------------------------------------

    def serve_forever(self) -> None:
        log.info("standby of %s serving on %s (data dir %s, epoch %d)",
                 self.config.standby_of, self.config.bind, self.config.data_dir, self.state.epoch)
        while not self._stopping and self.master is None:
            self.run_once(50)
        if self.master is not None and not self._stopping:
            self.master.serve_forever()

    def stop(self) -> None:
        self._stopping = True
        if self.master is not None:
            self.master.stop()

    def close(self) -> None:
        if self.master is not None:
            self.master.close()
            return
        self.checkpoints.poll(block=True)
        self.primary.close()
        self.router.close()
        self.wal.close()  # no checkpoint of its own at exit: that would roll its log

    def run_once(self, timeout_ms: int) -> None:
        mono = time.monotonic()
        if self.rid is None or mono - self.sent > RESEND_S:  # none out, or lost: ask (again)
            self._follow(mono)
        poller = zmq.Poller()
        poller.register(self.router.sock, zmq.POLLIN)
        poller.register(self.primary.open_socket(), zmq.POLLIN)
        poller.poll(timeout_ms)
        for peer, rid, msg in self.router.receive(0):
            self._answer(peer, rid, msg)
        self.primary.read_ready()
        reply = self.primary.take(self.rid) if self.rid is not None else None
        if self.primary.received():  # answers to Follows sent before: signs of life too
            self.heard = time.monotonic()
            self.primary.discard_received()
        if reply is not None:
            self.rid = None
            self._take(reply, time.monotonic())
            self.heard = time.monotonic()  # after the work: a long restore is not silence
        self.checkpoints.poll()
        silent = time.monotonic() - self.heard
        if self.promoting or (self.synced and 0 < self.config.failover_after_s < silent):
            if not self.promoting:
                log.warning("the primary %s has been silent for %.1fs; promoting this standby",
                            self.config.standby_of, silent)
            self.promote()

    def _follow(self, mono: float) -> None:
        segment, offset = self.wal.flushed_at
        if self.snapshot is not None:
            segment, offset = -self.snapshot[0] - 1, self.snapshot[1]
        try:
            self.rid = self.primary.send(p.Follow(self.config.addr, self.config.addr,
                                                  self.state.cluster_id, self.epoch, segment,
                                                  offset))
            self.sent = mono
        except TimeoutError:
            self.rid = None

    # -- the primary's answers ---------------------------------------------------------------

    def _take(self, reply: Any, mono: float) -> None:
        if isinstance(reply, p.Error):
            log.warning("the primary %s refuses to be followed: %s (%s)", self.config.standby_of,
                        reply.message, reply.code)
            self.sent = mono  # the next Follow after RESEND_S
            self.rid = -1
            return
        if reply.epoch < self.epoch:
            log.error("%s is of epoch %d, older than this standby's %d: not following it",
                      self.config.standby_of, reply.epoch, self.epoch)
            self.sent, self.rid = mono, -1
            return
        if isinstance(reply, p.SnapshotData):
            self._snapshot_part(reply)
        elif isinstance(reply, p.WalData):
            self._wal_data(reply)
            self.epoch = reply.epoch

    def _wal_data(self, msg: p.WalData) -> None:
        self.capabilities.adopt(list(msg.keys), msg.keys_rotated_at)
        if msg.segment > self.wal.flushed_at[0]:  # the primary rolled here: the state holds
            if self.checkpoints.due():            # exactly the records before this segment
                self.checkpoints.fork(self.state, msg.segment)
            self.wal.roll_to(msg.segment)
        if not msg.data:
            self._maybe_caught_up(msg)
            return
        bodies, good_end, problem = scan(msg.data)
        if problem is not None:
            raise WalCorrupt(f"the primary sent a damaged record at {msg.segment}:"
                             f"{msg.offset + good_end} ({problem})")
        self.wal.write_at(msg.segment, msg.offset, msg.data, len(bodies))
        for body in bodies:
            self.state.apply(records.unpack(body))
        self._maybe_caught_up(msg)

    def _maybe_caught_up(self, msg: p.WalData) -> None:
        """Holding all the primary had on disk, this standby has everything it confirmed."""
        if msg.at_end and not self.caught_up:
            self.caught_up = True
            log.info("caught up with the primary at segment %d, byte %d", *self.wal.flushed_at)

    def _snapshot_part(self, msg: p.SnapshotData) -> None:
        """Write part of the primary's checkpoint; with all of it, start over from it."""
        directory = self.wal.directory
        if msg.total == 0:  # the primary has no checkpoint: its log starts at segment 0
            self._start_over(0, State(), msg.epoch)
            return
        path = os.path.join(directory, checkpoint_file.checkpoint_name(msg.wal_start)) + ".part"
        if msg.offset == 0:
            log.info("receiving the primary's checkpoint (%d bytes): starting over from it",
                     msg.total)
        with open(path, "r+b" if msg.offset else "wb") as f:
            f.seek(msg.offset)
            f.write(msg.data)
            f.truncate()
            done = msg.offset + len(msg.data)
            if done < msg.total:
                self.snapshot = (msg.wal_start, done)
                return
            f.flush()
            os.fsync(f.fileno())
        final = path[:-len(".part")]
        os.rename(path, final)
        _, parts = checkpoint_file.read(final)
        self._start_over(msg.wal_start, State.restore(parts), msg.epoch)

    def _start_over(self, wal_start: int, state: State, epoch: int) -> None:
        directory = self.wal.directory
        self.checkpoints.poll(block=True)  # first: its file and prune must not land after ours
        for index in checkpoint_file.list_checkpoints(directory):
            if index != wal_start or state.cluster_id == "":
                os.remove(os.path.join(directory, checkpoint_file.checkpoint_name(index)))
        for name in os.listdir(directory):  # parts of a snapshot given up for a newer one
            if name.endswith(".ckpt.part"):
                os.remove(os.path.join(directory, name))
        self.wal.start_over(wal_start)
        self.caught_up = False
        self.state, self.snapshot, self.epoch = state, None, epoch
        self.checkpoints.mark = self.wal.records_written
        log.info("following from segment %d (%d items)", wal_start, len(state.items))

    # -- requests to the standby -------------------------------------------------------------

    def _answer(self, peer: bytes, rid: int, msg: Any) -> None:
        try:
            reply = self._handle(peer, rid, msg)
        except BlizzardError as exc:
            reply = error_reply(exc)
        if reply is not None:
            self.router.reply(peer, rid, reply)

    def _handle(self, peer: bytes, rid: int, msg: Any) -> Any:
        role = self.router.role_of(peer)
        if isinstance(msg, p.Hello):
            return p.Welcome(self.config.keys is not None, self.node_key, role or "",
                             self.state.epoch, self.primary_addr, release=RELEASE)
        if isinstance(msg, p.Promote):
            if role not in (None, "admin"):
                raise Forbidden(f"a {role} key may not send Promote; it needs an admin key")
            if not (self.synced or msg.force):
                raise InvalidArgument("this standby is not in sync with its primary, so it may "
                                      "lack acknowledged writes; promote with --force to accept "
                                      "that")
            self.promoting.append((peer, rid))
            return None
        raise NotPrimary(f"{self.config.addr} is a standby of {self.config.standby_of} (epoch "
                         f"{self.state.epoch}); ask the primary")

    # -- promotion ---------------------------------------------------------------------------

    def promote(self) -> None:
        """Become the primary: log the new epoch, then serve with this state, log and socket."""
        from master.server import MasterServer
        self.primary.close()
        self.checkpoints.poll(block=True)
        self.wal.rolls = True
        epoch = self.state.epoch + 1
        master = MasterServer(self.config, self.ctx, wal=self.wal, router=self.router,
                              recovered=(self.state, self.wal.records_written -
                                         self.checkpoints.mark))
        master.log_record(EpochBegun(epoch, self.config.addr))
        master.wal.flush()
        log.warning("promoted: this master is the primary now, epoch %d (was a standby of %s)",
                    epoch, self.config.standby_of)
        for peer, rid in self.promoting:
            self.router.reply(peer, rid, p.Promoted(epoch))
        self.promoting.clear()
        self.master = master
