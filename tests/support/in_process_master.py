"""A real ``MasterServer`` in this process, driven request by request.

Over an in-memory WAL and a stand-in router, with data nodes that exist only as heartbeats, so
each of the master's rules can be shown without a cluster (and without any process).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from blizzard.net.transport import raise_if_error
from blizzard.server.router import ConnectionEnds
from blizzard.wire import protocol as p
from master.config import MasterConfig
from master.log.wal import MemoryWal
from master.server import MasterServer


class NoRouter:
    """Stands in for the master's socket (all of ``blizzard.server.router.Router``): requests
    arrive as the test scripts them (``batches``), replies are kept, no connection has a key
    or a descriptor or ends. The master holds on to its methods: change what they do through
    these attributes, not by replacing them."""

    admitted = None  # security off
    poller = None  # nothing to poll: the loop is driven by the test

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, int, object]] = []
        self.roles: dict[bytes, str] | None = None  # a dict: peers' roles, as a secure router
        self.batches: list[list] = []  # what each ``receive`` returns in turn (then nothing)
        self.waits: list[int] = []  # the timeouts ``receive`` was called with
        self.on_reply: Callable[[bytes, int, object], None] | None = None  # told each reply

    def role_of(self, peer: bytes) -> str | None:
        return None if self.roles is None else self.roles.get(peer, "")

    def key_of(self, peer: bytes) -> str:
        return ""

    def fd_of(self, peer: bytes) -> int:
        return -1

    def departures(self) -> ConnectionEnds | None:
        return None

    def receive(self, timeout_ms: int, ready: bool = False) -> list:
        self.waits.append(timeout_ms)
        return self.batches.pop(0) if self.batches else []

    def reply(self, peer: bytes, rid: int, msg: object) -> None:
        self.sent.append((peer, rid, msg))
        if self.on_reply is not None:
            self.on_reply(peer, rid, msg)

    def close(self) -> None:
        pass


def join(server: MasterServer, node: str, port: int = 1) -> None:
    """Data node ``node`` heartbeats from its own connection (named after it)."""
    server.datanodes.heartbeat(p.Heartbeat(node, f"tcp://127.0.0.1:{port}", 0, 0, 10**12),
                               time.time(), time.monotonic(), node.encode())


def in_process_master(**config) -> MasterServer:
    """A master with one data node ``dn-a`` that has reported, out of safe mode."""
    server = MasterServer(MasterConfig(data_dir="unused", **config), wal=MemoryWal(),
                          router=NoRouter())
    join(server, "dn-a")
    server.tick(time.time(), time.monotonic())
    assert not server.safe_mode.on
    return server


def call(master: MasterServer, msg, peer: bytes = b"peer"):
    """One request through the handler, its records made durable, as a pass of the loop does."""
    reply = master.handle(peer, 1, msg, time.time(), time.monotonic())
    master.wal.flush()
    return raise_if_error(reply)


def place(master: MasterServer, n: int, peer: bytes = b"peer") -> p.Placement:
    """Ask for the ids and data nodes of ``n`` new items."""
    return call(master, p.Place(n, []), peer)


def report(master: MasterServer, ids: list[int], node: str = "dn-a", failed=(), error="") -> None:
    """``node`` tells the master it stored ``ids`` (and refused ``failed``)."""
    assert call(master, p.PutReport(node, list(ids), list(failed), error), node.encode()) is None


def enqueue_msg(ids: list[int], *, queue: str = "q", sizes=None, crcs=None, priorities=None,
                delays=None, keys=None, request: str = "r", hold: bool = False,
                wait_s: float = 5.0) -> p.Enqueue:
    """An ``Enqueue`` of ``ids``: 10 bytes each, no priority, delay or key unless given."""
    n = len(ids)
    return p.Enqueue(queue, list(ids), sizes or [10] * n, crcs or [7] * n, priorities or [0] * n,
                     delays or [0.0] * n, keys or [""] * n, False, request, hold, wait_s, None)


def waiting_replies(master: MasterServer, mono: float | None = None) -> list:
    """Replies for parked enqueues, as the loop's timers hand them out."""
    return [reply for _, _, reply in master.enqueues.serve_waiting(
        time.time(), mono if mono is not None else time.monotonic())]


def alloc(master: MasterServer, n: int, *, queue: str = "q", sizes=None, crcs=None,
          priorities=None, delays=None, keys=None, peer: bytes = b"peer") -> p.Placement:
    """Stage ``n`` items (placed, reported stored, held pending): what a later Commit needs."""
    placement = place(master, n, peer)
    report(master, placement.ids)
    stored = call(master, enqueue_msg(placement.ids, queue=queue, sizes=sizes, crcs=crcs,
                                      priorities=priorities, delays=delays, keys=keys,
                                      request=f"stage-{placement.first}", hold=True), peer)
    assert stored == p.Stored(["dn-a"])
    return placement
