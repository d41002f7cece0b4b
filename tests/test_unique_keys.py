"""Unique keys: an enqueue naming a key an earlier item of its queue took within its window
gets that item's id and makes nothing (master/state/unique_keys.py). Kept in the WAL and
checkpoints, so a restart keeps them; under concurrent producers, one item."""

from __future__ import annotations

import threading

import pytest

from blizzard import Client
from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument
from master.state import records
from master.state.machine import State
from master.state.records import AckItems, CommitItems, DeleteQueue
from master.state.unique_keys import Uniques

from support.records import commit
from support.together import in_threads


def test_keys_are_taken_by_records_and_run_out_as_later_records_apply():
    s = State()
    s.apply(commit([1, 2], ["a", ""], at=100.0, until=400.0))
    assert s.uniques.holder("q", "a", 399.0) == 1
    assert s.uniques.holder("q", "a", 400.0) is None  # its time is up
    assert s.uniques.holder("other", "a", 200.0) is None  # keys are per queue
    s.apply(commit([3], ["b"], at=500.0, until=800.0))  # a later record drops the stale ones
    assert len(s.uniques) == 1 and s.uniques.holder("q", "b", 600.0) == 3
    s.apply(DeleteQueue("q"))
    assert len(s.uniques) == 0


def test_keys_survive_a_checkpoint_and_replay_the_same():
    s = State()
    recs = [commit([1], ["a"], 100.0, 400.0), commit([2], ["b"], 150.0, 450.0),
            AckItems(ids=[1])]
    for rec in recs:
        s.apply(records.unpack(records.pack(rec)))
    again = State.restore(s.export_parts())
    assert again.snapshot() == s.snapshot()
    assert again.uniques.holder("q", "a", 200.0) == 1  # acked, still held for its window
    replayed = State()
    for rec in recs:
        replayed.apply(rec)
    assert replayed.snapshot() == s.snapshot()


def test_a_record_written_before_unique_keys_still_loads():
    old = CommitItems(queue="q", ids=[1], sizes=[1], crcs=[0], priorities=[0],
                      not_befores=[0.0], keys=[""], coalesce=False, nodes=["dn-a"], at=1.0,
                      request="r")
    body = records.pack(old)
    import msgpack
    fields = msgpack.unpackb(body)
    legacy = msgpack.packb(fields[:-2])  # as the code before unique keys wrote it
    assert records.unpack(legacy) == old


def test_the_heap_forgets_replaced_entries():
    u = Uniques()
    u.take("q", "k", 1, 10.0)
    u.take("q", "k", 2, 20.0)  # taken again after the first ran out
    u.expire(15.0)
    assert u.holder("q", "k", 15.0) == 2


@pytest.mark.cluster
def test_eight_concurrent_producers_of_one_unique_key_make_one_item(cluster_factory):
    cluster = cluster_factory(datanodes=2, replication=2)
    ids: list[int] = []
    start = threading.Barrier(8)

    def produce(k: int) -> None:
        with Client(cluster.master_addr, timeout_s=20) as c:
            start.wait()
            ids.append(c.enqueue("reports", f"from {k}".encode(), unique_key="daily-2026-11-26",
                                 unique_for_s=600))

    in_threads(produce, 8)
    assert len(ids) == 8 and len(set(ids)) == 1
    with Client(cluster.master_addr, timeout_s=20) as c:
        assert c.stats("reports")["ready"] == 1
        with pytest.raises(InvalidArgument):
            c.enqueue("reports", b"x", unique_key="k")  # no window
        with pytest.raises(InvalidArgument):
            c.enqueue("reports", b"x", unique_key="k", unique_for_s=31 * 86400)


@pytest.mark.cluster
def test_a_key_holds_across_a_master_kill_and_frees_when_done_if_asked(cluster_factory):
    cluster = cluster_factory(datanodes=2, replication=2)
    with Client(cluster.master_addr, timeout_s=30) as c:
        first = c.enqueue("jobs", b"one", unique_key="k", unique_for_s=600)
        live = c.enqueue("jobs", b"two", unique_key="live", unique_for_s=600,
                         unique_until_done=True)
    cluster.master.kill()  # kill -9
    cluster.restart_master()
    with Client(cluster.master_addr, timeout_s=30) as c:
        assert c.enqueue("jobs", b"again", unique_key="k", unique_for_s=600) == first
        assert c.enqueue("jobs", b"again", unique_key="live", unique_for_s=600,
                         unique_until_done=True) == live
        while True:  # take both, ack them
            m = c.dequeue("jobs", wait_s=5)
            assert m is not None
            m.ack(wait=True)
            if c.stats("jobs")["ready"] == 0:
                break
        # "k" is held for its window whatever became of its item; "live" only while its
        # item was queued or leased
        assert c.enqueue("jobs", b"three", unique_key="k", unique_for_s=600) == first
        fresh = c.enqueue("jobs", b"three", unique_key="live", unique_for_s=600,
                          unique_until_done=True)
        assert fresh != live
        assert c.stats("jobs")["ready"] == 1


def test_an_enqueue_message_names_one_key_per_item():
    msg = p.Enqueue("q", [1, 2], [1, 1], [0, 0], [0, 0], [0.0, 0.0], ["", ""], False, "r",
                    False, 1.0, None, ["a"], 10.0)
    assert p.decode(p.encode(1, msg))[1].uniques == ["a"]  # the master refuses the mismatch


@pytest.mark.cluster
def test_a_unique_task_called_by_eight_producers_at_once_is_queued_once(cluster_factory):
    from blizzard.worker.task import task

    @task("reports", unique_for_s=600)
    def nightly(day: str, *, full: bool = False) -> None:
        """A report that must not run twice for one day."""

    cluster = cluster_factory(datanodes=2, replication=2)
    ids: list[int] = []
    start = threading.Barrier(8)

    def produce() -> None:
        with Client(cluster.master_addr, timeout_s=20) as c:
            start.wait()
            ids.append(nightly.with_options(client=c).enqueue("2026-11-26", full=True))

    in_threads(lambda k: produce(), 8)
    assert len(ids) == 8 and len(set(ids)) == 1
    with Client(cluster.master_addr, timeout_s=20) as c:
        other_day = nightly.with_options(client=c).enqueue("2026-11-27", full=True)
        assert other_day != ids[0]
        explicit = nightly.with_options(client=c, unique_key="nightly").enqueue("x")
        assert nightly.with_options(client=c, unique_key="nightly").enqueue("y") == explicit
        assert c.stats("reports")["ready"] == 3
        with pytest.raises(InvalidArgument):
            nightly.with_options(client=c, unique_for_s=0.0, unique_key="k")
