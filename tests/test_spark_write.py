"""The batch writer's parts without a Spark job: Arrow rows to groups, staging through several
connections, commit order. (The writes through Spark are in ``test_spark.py``.)"""

from __future__ import annotations

import pyarrow as pa
import pytest

from blizzard import Client
from blizzard.spark import WriteOptions
from blizzard.spark import writer as w
from blizzard.wire.errors import InvalidArgument


def test_rows_of_a_data_only_batch_are_one_group_and_text_is_utf8():
    batch = pa.RecordBatch.from_arrays([pa.array(["a", "é", ""])], names=["data"])
    assert list(w.rows(batch, ["data"], 0)) == [((0, 0.0, None), [b"a", "é".encode(), b""])]


def test_rows_are_grouped_by_priority_delay_and_key():
    batch = pa.RecordBatch.from_arrays(
        [pa.array([b"a", b"b", b"c", b"d"]), pa.array([1, None, 1, 0], pa.int32()),
         pa.array(["k", None, "k", None])], names=["data", "priority", "key"])
    assert dict(w.rows(batch, ["data", "priority", "key"], 0)) == {
        (1, 0.0, "k"): [b"a", b"c"], (0, 0.0, None): [b"b", b"d"]}


def test_a_null_payload_is_refused_with_its_row_number():
    batch = pa.RecordBatch.from_arrays([pa.array([b"a", None])], names=["data"])
    with pytest.raises(InvalidArgument, match="row 11 has a null 'data'"):
        list(w.rows(batch, ["data"], 10))


def test_commit_plan_commits_the_oldest_ids_first():
    staged = [([3000, 3001], ["a", "b"], []), ([1000, 1001], ["a", "b"], []),
              ([2000], ["b", "c"], [])]
    assert w.commit_plan(staged, replication=2)[0][0] == [1000, 1001, 2000, 3000, 3001]


def test_a_task_stages_through_a_new_connection_every_per_connection_rows(cluster, monkeypatch):
    """The master keeps at most 200,000 staged items per connection: a big task moves on."""
    made: list[Client] = []

    class Counted(Client):
        def __init__(self, *args, **kw) -> None:
            super().__init__(*args, **kw)
            made.append(self)

    monkeypatch.setattr(w, "Client", Counted)
    blobs = [b"%05d" % i for i in range(10_000)]
    opts = WriteOptions(master=cluster.master_addr, queue="big")

    with w.Staging(opts, per_connection=2500) as staging:
        for i in range(0, 10_000, 3000):  # sends that straddle connections
            staging.send({(0, 0.0, None): blobs[i:i + 3000]})
        staged = staging.finish()

    assert len(made) == 4
    with Client(cluster.master_addr) as c:
        assert c.stats("big")["pending"] == 10_000
        c.commit(w.commit_plan(staged, c.status().replication))
        got = c.dequeue_many("big", 10_000)
    assert sorted(m.data for m in got) == blobs
