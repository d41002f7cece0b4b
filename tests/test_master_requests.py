"""The master's requests in-process: alloc checks, commits of whole, partial and mixed allocs, configure.

A real ``MasterServer`` over an in-memory WAL and a stand-in router, its requests handled in
process, with data nodes that exist only as heartbeats, so each rule is shown without a cluster.
"""

from __future__ import annotations

import math
import time

import pytest

from blizzard import protocol as p
from blizzard.errors import InvalidArgument, PayloadTooLarge, UnknownItem
from blizzard.transport import raise_if_error
from master.config import MasterConfig
from master.server import MasterServer
from master.wal import MemoryWal


class NoRouter:
    """Stands in for the master's socket: no requests arrive, replies are kept."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, int, object]] = []

    def receive(self, timeout_ms: int) -> list:
        return []

    def reply(self, peer: bytes, rid: int, msg: object) -> None:
        self.sent.append((peer, rid, msg))

    def close(self) -> None:
        pass


def in_process_master(**config) -> MasterServer:
    """A master with one data node ``dn-a`` that has reported, out of safe mode."""
    server = MasterServer(MasterConfig(data_dir="unused", **config), wal=MemoryWal(),
                          router=NoRouter())
    server.datanodes.heartbeat(p.Heartbeat("dn-a", "tcp://127.0.0.1:1", 0, 0, 10**12),
                               time.time(), time.monotonic())
    server.tick(time.time(), time.monotonic())
    assert not server.safe_mode.on
    return server


@pytest.fixture
def master():
    server = in_process_master(replication=1, max_item_bytes=1000)
    yield server
    server.close()


def call(master: MasterServer, msg, peer: bytes = b"peer"):
    """One request through the handler, its records made durable, as a pass of the loop does."""
    reply = master.handle(peer, 1, msg, time.time(), time.monotonic())
    master.wal.flush()
    return raise_if_error(reply)


def alloc(master: MasterServer, n: int, *, queue: str = "q", sizes=None, crcs=None,
          priorities=None, delays=None, keys=None) -> p.Placement:
    return call(master, p.Alloc(queue, sizes or [10] * n, crcs or [7] * n, priorities or [0] * n,
                                delays or [0.0] * n, keys or [""] * n, False, []))


@pytest.mark.parametrize("field, value, error, words", [
    ("sizes", 1001, PayloadTooLarge, "exceeds max-item-bytes"),
    ("sizes", -1, PayloadTooLarge, "-1 bytes"),
    ("crcs", -5, InvalidArgument, "checksum -5"),
    ("crcs", 2**32, InvalidArgument, "not a CRC-32"),
    ("priorities", 2**31, InvalidArgument, "32-bit"),
    ("delays", math.nan, InvalidArgument, "delay_s"),
    ("delays", math.inf, InvalidArgument, "delay_s"),
    ("delays", -0.5, InvalidArgument, "delay_s"),
    ("keys", "k" * 257, InvalidArgument, "at most 256"),
])
def test_one_bad_item_refuses_the_whole_alloc(master, field, value, error, words):
    good = {"sizes": [10] * 5, "crcs": [7] * 5, "priorities": [0] * 5, "delays": [0.0] * 5,
            "keys": [""] * 5}
    good[field][3] = value
    before = master.ids.next
    with pytest.raises(error, match=words):
        call(master, p.Alloc("q", good["sizes"], good["crcs"], good["priorities"],
                             good["delays"], good["keys"], False, []))
    assert master.enqueues.pending == {} and master.ids.next == before


def test_a_whole_alloc_commits_with_each_items_own_metadata(master):
    placement = alloc(master, 3, sizes=[1, 2, 3], crcs=[11, 12, 13], priorities=[2, 0, 1],
                      keys=["a", "", "c"])
    call(master, p.Commit(placement.ids, ["dn-a"], "r1"))
    items = [master.state.items[i] for i in placement.ids]
    assert [(i.size, i.crc, i.priority, i.key) for i in items] == \
        [(1, 11, 2, "a"), (2, 12, 0, ""), (3, 13, 1, "c")]
    assert master.enqueues.pending == {}
    assert master.state.head("q", 10, time.time()) == [placement.ids[1], placement.ids[2],
                                                      placement.ids[0]]


def test_parts_of_allocs_commit_in_any_order_and_across_allocs(master):
    first = alloc(master, 4, sizes=[1, 2, 3, 4])
    second = alloc(master, 2, sizes=[5, 6])
    call(master, p.Commit([first.ids[3], second.ids[0], first.ids[1]], ["dn-a"], "r1"))
    sizes = {i: master.state.items[i].size for i in master.state.items}
    assert sizes == {first.ids[3]: 4, second.ids[0]: 5, first.ids[1]: 2}
    assert set(master.enqueues.pending) == {first.ids[0], first.ids[2], second.ids[1]}
    call(master, p.Commit([first.ids[0], first.ids[2], second.ids[1]], ["dn-a"], "r2"))
    assert [master.state.items[i].size for i in first.ids + second.ids] == [1, 2, 3, 4, 5, 6]
    assert master.enqueues.pending == {}


def test_a_commit_naming_an_id_twice_is_refused_and_commits_nothing(master):
    placement = alloc(master, 3)
    with pytest.raises(InvalidArgument, match="more than once"):
        call(master, p.Commit([placement.ids[0], placement.ids[0]], ["dn-a"], "r1"))
    assert master.state.items == {} and len(master.enqueues.pending) == 3


def test_a_retried_commit_succeeds_and_an_unknown_id_is_refused(master):
    placement = alloc(master, 2)
    call(master, p.Commit(placement.ids, ["dn-a"], "r1"))
    assert call(master, p.Commit(placement.ids, ["dn-a"], "r1")).count == 2
    assert call(master, p.Commit(placement.ids, ["dn-a"], "r-other")).count == 2
    with pytest.raises(UnknownItem, match="not pending"):
        call(master, p.Commit([placement.ids[-1] + 1000], ["dn-a"], "r3"))


def test_an_uncommitted_rest_expires_and_its_blobs_are_deleted(master):
    placement = alloc(master, 3)
    call(master, p.Commit(placement.ids[:1], ["dn-a"], "r1"))
    master.enqueues.expire(time.monotonic() + master.config.pending_timeout_s + 1)
    assert master.enqueues.pending == {}
    assert master.deletes.take("dn-a") == placement.ids[1:]
    assert list(master.state.items) == placement.ids[:1]


def test_an_alloc_is_answered_before_the_fsync_only_if_its_ids_are_reserved_on_disk(
        master, monkeypatch):
    def alloc_msg(n: int) -> p.Alloc:
        return p.Alloc("q", [1] * n, [0] * n, [0] * n, [0.0] * n, [""] * n, False, [])

    events: list[tuple] = []
    monkeypatch.setattr(master.router, "reply", lambda peer, rid, msg: events.append(("reply", rid)))
    real_flush = master.wal.flush

    def flush() -> None:
        if master.wal.dirty:
            events.append(("fsync",))
        real_flush()
    monkeypatch.setattr(master.wal, "flush", flush)
    passes = [[(b"c", 1, alloc_msg(5)), (b"c", 2, alloc_msg(5))], [(b"c", 3, alloc_msg(3))]]
    monkeypatch.setattr(master.router, "receive", lambda timeout_ms: passes.pop(0))

    master.run_once(0)  # the first alloc reserves ids; the second uses that reservation
    assert events == [("fsync",), ("reply", 1), ("reply", 2)]
    events.clear()
    master.run_once(0)  # the reservation is on disk now: no need to wait for a sync
    assert events == [("reply", 3)]


def test_a_configure_out_of_bounds_is_refused_and_logs_nothing(master):
    """The client checks settings first, but the master must not rely on it (P7)."""
    unset = dict.fromkeys(p.Configure.__dataclass_fields__) | {"queue": "q", "create": False}
    call(master, p.Configure(**unset | {"max_attempts": 2}))
    logged = len(master.wal.records)
    before = master.state.config("q")
    for bad in ({"lease_s": 0.0}, {"burst": -1}, {"dead_letter": " spaced "},
                {"backoff_cap_s": math.inf}):
        with pytest.raises(InvalidArgument, match=next(iter(bad))):
            call(master, p.Configure(**unset | bad))
    assert master.state.config("q") == before and before.max_attempts == 2
    assert len(master.wal.records) == logged
