"""The client's one read check (``blizzard/client/datanodes.py``: ``intact``) on its one-node
read, ``DatanodePool.read_from`` (Spark's executors read through it), without processes: the
data node's replies are given."""

from __future__ import annotations

import zlib
from typing import Any

import pytest
import zmq

import blizzard.client.datanodes as datanodes
from blizzard.client.datanodes import DatanodePool, intact
from blizzard.wire import protocol as p
from blizzard.wire.errors import Forbidden

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


def replying(monkeypatch: pytest.MonkeyPatch, reply: Any) -> list[Any]:
    """The node answers every ``Get`` with ``reply``; the requests sent."""
    sent: list[Any] = []

    def call_many(calls: list[tuple[Any, Any]], timeout_s: float) -> list[Any]:
        sent.extend(request for _, request in calls)
        return [reply for _ in calls]
    monkeypatch.setattr(datanodes, "call_many", call_many)
    return sent


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
