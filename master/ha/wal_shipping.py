"""The primary's side of a standby: ship the WAL, hold replies until the standby has them, and
stop when a master of a newer epoch shows up.

A standby asks with ``Follow(segment, offset)``: it holds the log durably up to there, which
also acknowledges everything before it. The primary answers with the whole records after
that point as they lie on its disk (never more than it has fsynced itself), or parks the
request until the next pass writes some (``PARK_S`` at most: the empty answer is its sign of
life to the standby). A standby of another epoch, or one so far behind that a checkpoint
covered its segment, is sent the newest checkpoint file instead and starts over from it.

When a standby has caught up, the primary logs ``StandbySynced``: from then on (and after a
restart, since it is in the log) every reply waits until that standby acknowledged the end of
the pass it came from. So nothing a client heard "ok" for can be missing on the standby, and a
primary cut off from its standby confirms nothing at all: after a failover it cannot
contradict the new primary. A promotion (``EpochBegun``) ends that: the new primary answers
alone until a standby catches up with it.

Fencing: a primary that learns of a newer epoch (from a standby, a data node's heartbeat, or
by asking its silent standby) exits; its log may hold records the new primary never got, so
it comes back as a standby, which starts over from a snapshot.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

from blizzard.net.transport import Endpoint, call
from blizzard.wire import protocol as p
from blizzard.wire.errors import ForeignCluster, InvalidArgument
from master.ha.epoch_proof import EpochProof
from master.log import checkpoint_file
from master.log.wal import MemoryWal, Wal
from master.state.machine import State
from master.state.records import StandbySynced

Reply = Callable[[bytes, int, Any], None]  # (peer, request id, message)
KeyRing = Callable[[], tuple[list[p.CapabilityKey], float]]  # the keys, when they rotated

log = logging.getLogger(__name__)

PARK_S = 0.25  # a caught-up standby's Follow waits at most this long for new records
# WAL bytes in one reply (whole records; one larger record goes whole)
MAX_SHIP_BYTES = 4 * 1024 * 1024
EXIT_FENCED = 75
PROBE_EVERY_S = 1.0
MAX_STANDBYS = 16  # standby names remembered (a name is what a Follow calls itself)
WARN_EVERY_S = 30.0


def exit_fenced(why: str) -> None:
    log.critical("fenced: %s; this master stops. Its log may hold records the primary never "
                 "got: start it with --standby-of the primary to follow it.", why)
    logging.shutdown()
    os._exit(EXIT_FENCED)


class Replication:
    """Standbys following this primary, the replies waiting for them, and fencing."""

    def __init__(self, state: State, wal: Wal | MemoryWal, log_record: Callable[[Any], None],
                 ctx: zmq.Context[zmq.Socket[bytes]], *, key_ring: KeyRing,
                 reply: Reply, send: Reply, ids_synced: Callable[[int], None], sync: bool,
                 failover_after_s: float, keys: Any = None,
                 on_fenced: Callable[[str], None] = exit_fenced) -> None:
        """``reply`` answers a standby now; ``send`` sends a reply of a pass once the sync
        standby holds it (a data node's, if it answers the request: master/consume/pushes.py),
        after ``ids_synced`` is told the id high-water mark the standby holds with it;
        ``key_ring`` is the capability keys and when they rotated, shipped with the log."""
        self.state = state
        self.wal = wal
        self.log = log_record
        self.ctx = ctx
        self.key_ring = key_ring
        self.reply = reply
        self.send = send
        self.ids_synced = ids_synced
        self.sync = sync
        self.failover_after_s = failover_after_s
        self.keys = keys  # ClientKeys to ask a silent standby for its epoch (None: insecure)
        self.proof = EpochProof(keys.secret if keys is not None else None)
        self._unproven_logged = -WARN_EVERY_S
        self.on_fenced = on_fenced
        self.acked: dict[str, tuple[int, int]] = {}  # standby -> the log it holds durably
        self.seen: dict[str, float] = {}  # standby -> monotonic time of its last Follow
        self.parked: dict[str, tuple[bytes, int, p.Follow, float]] = {}
        self.held: deque[tuple[tuple[int, int], int, list[tuple[bytes, int, Any]]]] = deque()
        self._probed = self._warned = -WARN_EVERY_S
        self.started = time.monotonic()  # a standby not heard from since counts as silent
        if not sync and state.standby[0]:  # running alone now: the standby is no longer
            log_record(StandbySynced("", ""))  # in sync, and must not think it is

    @property
    def sync_name(self) -> str:
        """The standby every reply waits for ("" if none)."""
        return self.state.standby[0] if self.sync else ""

    # -- requests ----------------------------------------------------------------------------

    def follow(self, msg: p.Follow, now: float, mono: float, peer: bytes, rid: int) -> Any:
        state, wal = self.state, self.wal
        self._check(msg, mono)
        if msg.cluster_id and msg.cluster_id != state.cluster_id:
            raise ForeignCluster(f"this master is of cluster {state.cluster_id}; the standby "
                                 f"{msg.addr[:200]} of cluster {msg.cluster_id[:64]}")
        if msg.cluster_id:  # of this cluster: a newer epoch means this master was replaced
            self.check_epoch(msg.epoch, f"standby {msg.addr[:200]}")
        wal = self._log_on_disk()
        pos = (msg.segment, msg.offset)
        self.seen[msg.name] = mono
        if msg.epoch != state.epoch or pos > wal.flushed_at or not wal.has_segment(msg.segment):
            return self._snapshot(msg)
        self.acked[msg.name] = max(self.acked.get(msg.name, pos), pos)
        reply = self._ship(pos)
        if reply is not None:
            return reply
        if self.sync and state.standby[0] != msg.name and not wal.dirty:
            log.info("standby %s caught up; replies now wait for it", msg.addr)
            self.log(StandbySynced(msg.name[:200], msg.addr[:200]))
        self.parked[msg.name] = (peer, rid, msg, mono + PARK_S)
        return None

    def _check(self, msg: p.Follow, mono: float) -> None:
        """Refuse a malformed Follow, and a second standby while the one in sync is alive:
        two that both believe they are in sync could both take over."""
        if not (0 < len(msg.name) <= 200 and 0 <= msg.offset < 2**62 and
                -2**40 <= msg.segment < 2**40 and (msg.segment >= 0 or msg.offset < 2**40)):
            raise InvalidArgument("a Follow needs a name of 1-200 characters, offset >= 0 and "
                                  "a segment in range")
        sync = self.sync_name
        if sync and msg.name != sync and \
                mono - self.seen.get(sync, self.started) < max(self.failover_after_s, PARK_S * 4):
            raise InvalidArgument(f"this primary has a standby in sync ({sync}); it takes one")
        if msg.name not in self.seen and len(self.seen) >= MAX_STANDBYS:
            raise InvalidArgument(f"this primary follows at most {MAX_STANDBYS} standby names")

    def fence_by(self, msg: p.Heartbeat) -> None:
        """Fence this master if a data node of its cluster saw a newer epoch and shows the
        masters' proof of it (``master/ha/epoch_proof.py``)."""
        state = self.state
        if msg.cluster_id == state.cluster_id and msg.epoch > state.epoch:
            if self.proof.believes(msg.cluster_id, msg.epoch, msg.epoch_proof):
                self.check_epoch(msg.epoch, f"data node {msg.node_id[:64]}")
            else:
                self._unproven(msg)

    def stamp(self, reply: p.HeartbeatReply) -> p.HeartbeatReply:
        """``reply`` telling the data node this master's epoch, with its proof."""
        state = self.state
        return p.replace(reply, epoch=state.epoch,
                                   epoch_proof=self.proof.make(state.cluster_id, state.epoch))

    def _unproven(self, msg: p.Heartbeat) -> None:
        """A node named a newer epoch without the masters' proof: ignored (every
        ``WARN_EVERY_S`` a line, whoever floods)."""
        mono = time.monotonic()
        if mono - self._unproven_logged >= WARN_EVERY_S:
            self._unproven_logged = mono
            log.warning("data node %s claims epoch %d without the masters' proof; ignored "
                        "(a data node key cannot fence a master)", msg.node_id[:64], msg.epoch)

    def check_epoch(self, epoch: int, who: str) -> None:
        if epoch > self.state.epoch:
            self.on_fenced(f"{who} has seen epoch {epoch}; this master is of epoch "
                           f"{self.state.epoch}")

    def keep_from(self) -> int | None:
        """The oldest segment the sync standby still reads: a checkpoint must not prune it, or
        the standby would start over from a snapshot while every reply waits for it."""
        acked = self.acked.get(self.sync_name) if self.sync_name else None
        return acked[0] if acked is not None else None

    # -- shipping ----------------------------------------------------------------------------

    def _log_on_disk(self) -> Wal:
        """The log standbys follow; a master on a ``MemoryWal`` (tests) has none to ship."""
        wal = self.wal
        if wal.directory is None:
            raise ForeignCluster("this master keeps no log on disk to follow")
        return wal

    def _ship(self, pos: tuple[int, int]) -> p.WalData | None:
        """The records after ``pos``; None if there are none yet."""
        wal = self._log_on_disk()
        segment, offset = pos
        data = wal.read_at(segment, offset, MAX_SHIP_BYTES) or b""
        if not data and wal.flushed_at[0] > segment:  # the primary rolled: on to the next one
            segment, offset = segment + 1, 0
            data = wal.read_at(segment, 0, MAX_SHIP_BYTES) or b""
        elif not data:
            return None
        return self._wal_data(segment, offset, data)

    def _wal_data(self, segment: int, offset: int, data: bytes) -> p.WalData:
        keys, rotated_at = self.key_ring()
        at_end = (segment, offset + len(data)) == self.wal.flushed_at
        return p.WalData(self.state.epoch, segment, offset, data, keys, rotated_at,
                         at_end)

    def _snapshot(self, msg: p.Follow) -> p.SnapshotData:
        """Part of the newest checkpoint (the standby starts over from it), or, with none yet,
        an empty one that sends it to the log's first segment."""
        wal = self._log_on_disk()
        found = checkpoint_file.list_checkpoints(wal.directory)
        if not found:
            return p.SnapshotData(self.state.epoch, 0, 0, 0, b"")
        start = found[-1]
        path = os.path.join(wal.directory, checkpoint_file.checkpoint_name(start))
        offset = msg.offset if msg.segment == -start - 1 else 0  # resuming this checkpoint
        with open(path, "rb") as f:
            total = os.fstat(f.fileno()).st_size
            f.seek(offset)
            data = f.read(MAX_SHIP_BYTES)
        return p.SnapshotData(self.state.epoch, start, offset, total, data)

    def serve_parked(self, mono: float) -> None:
        """Answer parked Follows that have records now, or have waited ``PARK_S``."""
        for name, (peer, rid, msg, deadline) in list(self.parked.items()):
            pos = (msg.segment, msg.offset)
            reply = self._ship(pos)
            if reply is None and mono < deadline:
                continue
            del self.parked[name]
            self.reply(peer, rid, reply or self._wal_data(*pos, b""))

    # -- replies -----------------------------------------------------------------------------

    def release(self, replies: list[tuple[bytes, int, Any]]) -> None:
        """Send this pass's replies (flushed) once the sync standby holds the pass, and those of
        earlier passes it has acknowledged since."""
        name = self.sync_name
        if replies or not name:
            self.held.append((self.wal.flushed_at, self.state.id_hi, replies))
        acked = self.acked.get(name, (-1, 0)) if name else None
        while self.held and (acked is None or self.held[0][0] <= acked):
            _, id_hi, ready = self.held.popleft()
            self.ids_synced(id_hi)
            for peer, rid, reply in ready:
                self.send(peer, rid, reply)

    def watch(self, mono: float) -> None:
        """With the sync standby silent, ask it now and then whether it was promoted: if so,
        this master is fenced (until then, what it logs waits for the standby)."""
        name = self.sync_name
        if not name or mono - self._probed < PROBE_EVERY_S or \
                mono - self.seen.get(name, self.started) < self.failover_after_s:
            return
        self._probed = mono
        addr = self.state.standby[1]
        endpoint = Endpoint(self.ctx, addr, self.keys,
                            self.keys.master if self.keys else None)
        try:
            welcome = call(endpoint, p.Hello(), 0.2)
        except Exception as exc:  # unreachable or refusing: no news, keep waiting
            if mono - self._warned >= WARN_EVERY_S:
                self._warned = mono
                log.warning("sync standby %s silent for %.1fs and not answering (%s): nothing "
                            "is confirmed until it is back (or restart this master with "
                            "--no-sync-standby)", addr, mono - self.seen.get(name, self.started),
                            type(exc).__name__)
            return
        finally:
            endpoint.close()
        if isinstance(welcome, p.Welcome):
            self.check_epoch(welcome.epoch, f"the standby at {addr}")
