"""The client's data-node side without processes: what an unreadable batch is reported as."""

from __future__ import annotations

from blizzard.client.datanodes import Reads
from blizzard.client.message import LeasedItem
from blizzard.wire.errors import DataCorrupt, DatanodeUnavailable, Forbidden
from blizzard.wire.protocol import NodeRef


def item(item_id: int, *node_ids: str) -> LeasedItem:
    return LeasedItem(id=item_id, lease=1, size=3, crc=0, attempts=0, priority=0, enqueued_at=0.0,
                      nodes=[NodeRef(n, f"tcp://127.0.0.1:{6000 + ord(n)}") for n in node_ids])


def test_items_bad_on_every_replica_are_corrupt():
    failed = [item(1, "a", "b"), item(2, "b")]
    reads = Reads({}, failed, bad=[(1, "a"), (1, "b"), (2, "b")])
    assert reads.corrupt() == failed
    error = reads.unreadable()
    assert isinstance(error, DataCorrupt) and "[1, 2]" in error.message


def test_a_replica_that_did_not_answer_leaves_the_item_only_unavailable():
    # Item 1's replica on "b" timed out (no bad report): it may hold a good copy.
    reads = Reads({}, [item(1, "a", "b"), item(2, "c")], bad=[(1, "a"), (2, "c")])
    assert [i.id for i in reads.corrupt()] == [2]
    assert type(reads.unreadable()) is DatanodeUnavailable


def test_an_item_without_replicas_is_not_called_corrupt():
    reads = Reads({}, [item(1)], bad=[])
    assert reads.corrupt() == []
    assert type(reads.unreadable()) is DatanodeUnavailable


def test_a_read_a_data_node_refused_as_forbidden_fails_with_that_reason():
    reads = Reads({}, [item(1, "a")], bad=[], forbidden="the grant expired 3.0s ago")
    error = reads.unreadable()
    assert isinstance(error, Forbidden) and "expired" in error.message
