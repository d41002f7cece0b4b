"""The client's one read check (``blizzard/client/datanodes.py``: ``intact``) on its one-node
read, ``DatanodePool.read_from`` (Spark's executors read through it), and the hedged read with
replica fail-over, ``DatanodePool.read``, without processes: the data nodes' replies are given."""

from __future__ import annotations

import zlib
from typing import Any

import pytest
import zmq

import blizzard.client.datanodes as datanodes
from blizzard.client.datanodes import DatanodePool, intact
from blizzard.client.message import LeasedItem
from blizzard.net.hedge import HedgeDelays
from blizzard.wire import protocol as p
from blizzard.wire import push_signature
from blizzard.wire.errors import DataCorrupt, DatanodeUnavailable, Forbidden

NODE = p.NodeRef("n1", "tcp://127.0.0.1:9")
GOOD, OTHER = b"payload", b"another"


def test_intact_means_the_size_and_the_crc_stored():
    assert intact(GOOD, len(GOOD), zlib.crc32(GOOD))
    assert not intact(GOOD, len(GOOD), zlib.crc32(OTHER))  # a flipped bit
    assert not intact(GOOD[:-1], len(GOOD), zlib.crc32(GOOD[:-1]))  # truncated, CRC of what came
    assert not intact(None, 0, 0)  # not sent at all


@pytest.fixture
def pool():
    pool = DatanodePool(zmq.Context.instance(), node_timeout_s=1.0)
    yield pool
    pool.close()


class Node:
    """A data node's end of a connection, in process: it answers each ``Get`` with what
    ``answer`` returns for its ids (None: it never answers, as a stopped node would)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.sent: list[Any] = []
        self.replies: dict[int, Any] = {}
        self.forgotten: set[int] = set()
        self.refused = None
        self.addr = "tcp://127.0.0.1:9"

    def send(self, msg: Any) -> int:
        self.sent.append(msg)
        rid = len(self.sent)
        reply = self.answer(msg)
        if reply is not None:
            self.replies[rid] = reply
        return rid

    def has(self, rid: int) -> bool:
        return rid in self.replies

    def wait(self, timeout_ms: int) -> bool:
        return bool(self.replies)

    def read_ready(self, want: int = 0) -> None:
        pass

    def take(self, rid: int) -> Any:
        return self.replies.pop(rid, None)

    def forget(self, rid: int) -> None:
        self.forgotten.add(rid)


def replying(monkeypatch: pytest.MonkeyPatch, reply: Any) -> list[Any]:
    """The node answers every ``Get`` with ``reply`` (a ``TimeoutError``: never); the
    requests sent."""
    node = Node(lambda msg: None if isinstance(reply, TimeoutError) else reply)
    monkeypatch.setattr(DatanodePool, "endpoint", lambda self, addr: node)
    return node.sent


def test_read_from_keeps_intact_payloads_and_names_the_positions_of_the_others(pool, monkeypatch):
    # Given a node that sends item 1 intact, item 2 damaged, says item 3 is missing and
    # leaves item 4 out (its reply was full)
    sent = replying(monkeypatch, p.Blobs([1, 2], [GOOD, b"payloaX"], [0, 0], [3]))
    ids, sizes = [1, 2, 3, 4], [len(GOOD)] * 4
    crcs = [zlib.crc32(GOOD)] * 4
    # When the four are read from it
    read = pool.read_from(NODE, ids, sizes, crcs, None)
    # Then only item 1 is served, and positions 1-3 go to the read with fail-over
    assert read.payloads == {1: GOOD}
    assert read.rest == [1, 2, 3] and not read.forbidden
    assert [r.ids for r in sent] == [ids]


def test_a_node_that_times_out_is_avoided_and_serves_nothing(pool, monkeypatch):
    replying(monkeypatch, TimeoutError())
    read = pool.read_from(NODE, [1, 2], [1, 1], [0, 0], None)
    assert read.payloads == {} and read.rest == [0, 1] and not read.forbidden
    assert pool.suspected() == ["n1"]


def test_a_refused_grant_is_said_so_the_reader_can_renew_it(pool, monkeypatch):
    replying(monkeypatch, p.Error(Forbidden.code, "the grant expired 3.0s ago"))
    read = pool.read_from(NODE, [1], [1], [0], None)
    assert read.forbidden and read.rest == [0] and pool.suspected() == []


# -- the hedged read (``DatanodePool.read``) -------------------------------------------------

def nodes_answering(monkeypatch: pytest.MonkeyPatch, **answers: Any) -> dict[str, Node]:
    """Data nodes by address, each answering as given; replies are there as soon as sent."""
    nodes = {addr: Node(answer) for addr, answer in answers.items()}
    monkeypatch.setattr(DatanodePool, "endpoint", lambda self, addr: nodes[addr])

    class Replies:  # nothing to wait for: a fake node's reply is in its table at once
        def __init__(self, endpoints: Any) -> None:
            pass

        def read(self, timeout_ms: int, want: int = 0) -> None:
            pass
    monkeypatch.setattr(datanodes, "Replies", Replies)
    return nodes


def item(item_id: int, *addrs: str, data: bytes = GOOD) -> LeasedItem:
    return LeasedItem(item_id, 1, len(data), zlib.crc32(data), 1, 0, 0.0,
                      [p.NodeRef(a, a) for a in addrs])


def blobs(data: bytes) -> Any:
    return lambda msg: p.Blobs(msg.ids, [data] * len(msg.ids), [0] * len(msg.ids), [])


def test_a_read_goes_to_the_next_replica_when_the_first_is_silent_past_its_hedge_delay(
        pool, monkeypatch):
    # Given a stopped node (it never answers) listed first, and a healthy one
    nodes = nodes_answering(monkeypatch, stopped=lambda msg: None, healthy=blobs(GOOD))
    pool.delays = HedgeDelays(floor_s=0.01, cap_s=0.02)
    # When an item on both is read
    reads = pool.read([item(7, "stopped", "healthy")])
    # Then the healthy node serves it, the stopped node's ask is hedged and its late reply
    # will be dropped unread, and the stopped node is asked last for a while
    assert reads.payloads == {7: GOOD} and not reads.failed and not reads.bad
    assert pool.hedges == 1 and pool.gets == 2
    assert nodes["stopped"].forgotten == {1}
    assert pool.suspected() == ["stopped"]


def test_a_hedged_read_that_gets_a_corrupt_copy_takes_the_good_one(pool, monkeypatch):
    # Given a first replica with a damaged copy and a second with a good one
    nodes_answering(monkeypatch, damaged=blobs(b"payloaX"), good=blobs(GOOD))
    # When the item is read
    reads = pool.read([item(8, "damaged", "good")])
    # Then the good copy is served and the bad one reported
    assert reads.payloads == {8: GOOD} and reads.bad == [(8, "damaged")] and not reads.failed


def test_every_replica_damaged_is_corrupt_and_a_silent_one_is_unavailable(pool, monkeypatch):
    nodes_answering(monkeypatch, a=blobs(b"payloaX"), b=blobs(b"payloaY"),
                    stopped=lambda msg: None)
    pool.node_timeout_s = 0.05
    pool.delays = HedgeDelays(floor_s=0.01, cap_s=0.01)
    corrupt = pool.read([item(9, "a", "b")])
    assert corrupt.corrupt() == corrupt.failed and len(corrupt.failed) == 1
    assert isinstance(corrupt.unreadable(), DataCorrupt)
    silent = pool.read([item(10, "a", "stopped")])  # one bad copy, one replica silent
    assert silent.failed and not silent.corrupt()
    assert isinstance(silent.unreadable(), DatanodeUnavailable)


def test_a_healthy_read_sends_one_get_per_node_and_no_hedge(pool, monkeypatch):
    nodes = nodes_answering(monkeypatch, a=blobs(GOOD), b=blobs(GOOD))
    reads = pool.read([item(i, "a", "b") for i in range(5)] + [item(9, "b", "a")])
    assert set(reads.payloads) == {0, 1, 2, 3, 4, 9}
    assert pool.hedges == 0 and len(nodes["a"].sent) == 1 and len(nodes["b"].sent) == 1


def test_payloads_pushed_with_a_lease_are_taken_if_intact_and_only_the_rest_are_read(
        pool, monkeypatch):
    # Given a lease a data node answered with item 1 intact, item 2 damaged, item 3 not at all
    nodes = nodes_answering(monkeypatch, a=blobs(GOOD))
    answer = p.Leased("q", [1, 2, 3], [], [], [], [], [], [], [], [], [], [],
                      p.GetGrant([], [], 0, 0.0, b""), [])
    frame = p.encode(7, answer)
    pushed = p.Pushed(frame, push_signature.sign(pool.push_key, frame), [1, 2],
                      [GOOD, b"payloaX"], [0, 0], [3])
    # (taken only if the master signed it for this pool, as the answer to its request 7)
    assert pool.genuine(7, pushed) and not pool.genuine(8, pushed)
    forged = p.encode(7, p.replace(answer, ids=[1, 2, 4]))
    assert not pool.genuine(7, p.replace(pushed, answer=forged))
    signed_ping = p.encode(7, p.Ping())  # signed, but no lease's answer
    assert not pool.genuine(7, p.replace(pushed, answer=signed_ping,
                                         mac=push_signature.sign(pool.push_key, signed_ping)))
    assert not pool.genuine(7, p.Blobs([1], [GOOD], [0], []))
    leased = pool.take_pushed(pushed)
    assert leased.ids == [1, 2, 3] and pool.pushes == 1
    # When the three are read
    reads = pool.read([item(i, "a") for i in (1, 2, 3)])
    # Then item 1 is not asked for again (P5: checked as a read one is); 2 and 3 are read
    assert reads.payloads == {1: GOOD, 2: GOOD, 3: GOOD} and not reads.failed
    assert [msg.ids for msg in nodes["a"].sent] == [[2, 3]]
    # and the pushed payloads serve that one read only
    assert pool.pushed == {}
    pool.take_pushed(p.Leased("q", [], [], [], [], [], [], [], [], [], [], [],
                              p.GetGrant([], [], 0, 0.0, b""), []))
    assert pool.pushed == {} and pool.pushes == 1
