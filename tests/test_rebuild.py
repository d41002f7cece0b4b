"""``master --rebuild-from-datanodes``: a master whose data dir is gone, rebuilt from its nodes.

Real processes on loopback ports and real LevelDB stores: the master is killed (-9) and its
data dir deleted, then a master started on the same address with the nodes' addresses gets
every queued item back from the metadata the nodes keep beside the blobs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading

import pytest

from blizzard import Client
from blizzard.local.harness import LocalCluster, Proc
from blizzard.net.transport import call
from blizzard.wire import protocol as p
from blizzard.wire.errors import BlizzardError, Forbidden, InvalidArgument

from support.wait import wait_for

FAST = dict(heartbeat_s=0.2, dead_after_s=1.5)


def rebuild_master(cluster: LocalCluster) -> None:
    """Kill the master, delete its data dir, and start one that rebuilds from every node."""
    cluster.master.kill()
    shutil.rmtree(os.path.join(cluster.base_dir, "master"))
    addrs = ",".join(n.addr for n in cluster.nodes)
    old = cluster.master
    cluster.master = Proc("master", [*old.argv, "--rebuild-from-datanodes", addrs],
                          old.log_path, old.addr).start()
    cluster.wait_ready(30)


def node_metas(cluster: LocalCluster, i: int, key: str = "admin") -> dict[int, p.ItemMeta]:
    """Item id -> metadata as data node ``i`` keeps it (one page: these tests hold few)."""
    ep = cluster.endpoint(cluster.nodes[i].addr, key)
    try:
        page = call(ep, p.ListMeta(0, 5000), 5)
    finally:
        ep.close()
    return {i: m for m in page.metas for i in m.ids}


def test_every_unacked_item_comes_back_after_the_master_dir_is_lost_under_load(cluster_factory):
    cluster = cluster_factory(datanodes=3, replication=2, **FAST)
    enqueued: set[int] = set()  # acknowledged enqueues
    acked: set[int] = set()  # acknowledged acks
    before_loss: set[int] = set()
    stop = threading.Event()
    errors: list[BaseException] = []

    def produce() -> None:
        with Client(cluster.master_addr, timeout_s=30) as c:
            n = 0
            while not stop.is_set() and n < 400:
                enqueued.update(c.enqueue_many("load", [b"item-%d" % n] * 20, priority=n % 3))
                n += 1

    def consume() -> None:
        with Client(cluster.master_addr, timeout_s=30) as c:
            while not stop.is_set():
                msgs = c.dequeue_many("load", 10, lease_s=2.0, wait_s=0.2)
                try:
                    c.ack_many(msgs)
                    acked.update(m.id for m in msgs)
                except BlizzardError:  # a lease the rebuilt master does not know: comes back
                    pass

    def guarded(work):
        def run() -> None:
            try:
                work()
            except BaseException as exc:  # shown by the main thread
                errors.append(exc)
        return threading.Thread(target=run, daemon=True)

    with Client(cluster.master_addr, timeout_s=10) as c:  # a backlog to lose
        enqueued.update(c.enqueue_many("load", [b"backlog"] * 2000, priority=1))
    threads = [guarded(produce), guarded(consume)]
    for t in threads:
        t.start()
    wait_for(lambda: len(enqueued) > 3000 and len(acked) > 200, 20, "load to flow")
    before_loss.update(enqueued)
    assert len(before_loss - acked) > 1000  # a backlog to lose
    rebuild_master(cluster)  # while producer and consumer go on, riding through it
    wait_for(lambda: len(enqueued) > len(before_loss) + 200 or errors, 20, "load after rebuild")
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors, errors
    # Every item acknowledged and not acked is still there (acked ones may be too)
    with Client(cluster.master_addr, timeout_s=10) as c:
        wait_for(lambda: c.stats("load")["leased"] == 0, 10, "leases to run out")
        left: set[int] = set()
        while msgs := c.dequeue_many("load", 1000):
            left.update(m.id for m in msgs)
            c.ack_many(msgs)
    missing = enqueued - acked - left
    assert not missing, f"{len(missing)} acknowledged items lost, e.g. {sorted(missing)[:5]}"
    # Ids handed out after the rebuild lie above every id from before (P4)
    assert min(enqueued - before_loss) > max(before_loss)
    assert "rebuilt cluster" in cluster.master.head()


def test_a_dead_lettered_and_a_nacked_item_rebuild_where_they_were(cluster_factory):
    cluster = cluster_factory(datanodes=2, replication=2, **FAST)
    cluster_id = cluster.status().cluster_id
    with Client(cluster.master_addr, timeout_s=10, admin=True) as c:
        c.create_queue("jobs", max_attempts=2)
        dead_id = c.enqueue("jobs", b"doomed", key="k")
        nacked_id = c.enqueue("jobs", b"again", priority=5)
        c.enqueue("jobs", b"later", delay_s=3600)  # one of the two delayed after the rebuild
        for _ in range(2):
            c.dequeue("jobs", lease_s=30).nack(delay_s=0, error="boom")  # the first item twice
        c.dequeue("jobs", lease_s=30).nack(delay_s=600, error="once")
        assert c.stats("jobs.dead")["ready"] == 1
    # Given both nodes heard of the changes (heartbeat replies carry them)
    wait_for(lambda: all(node_metas(cluster, i)[dead_id].queue == "jobs.dead" and
                         node_metas(cluster, i)[nacked_id].attempts == 1 for i in range(2)),
             10, "metadata updates on the nodes")
    rebuild_master(cluster)
    assert cluster.status().cluster_id == cluster_id  # the nodes' cluster, adopted
    with Client(cluster.master_addr, timeout_s=10, admin=True) as c:
        assert c.stats("jobs") | {"oldest_age_s": 0} == \
            {"queue": "jobs", "ready": 0, "delayed": 2, "leased": 0, "pending": 0, "dead": 1,
             "oldest_age_s": 0}
        (dead,) = c.peek("jobs.dead")
        assert (dead.id, dead.data, dead.attempts, dead.key) == (dead_id, b"doomed", 2, "k")
        assert c.redrive("jobs") == 1  # its origin came back with it
        msg = c.dequeue("jobs")
        assert (msg.id, msg.attempts) == (dead_id, 0)
        msg.ack(wait=True)


def test_a_rebuild_refuses_a_data_dir_with_a_wal(cluster_factory):
    cluster = cluster_factory(datanodes=1, replication=1, **FAST)
    cluster.master.stop()
    data_dir = os.path.join(cluster.base_dir, "master")
    before = sorted(os.listdir(os.path.join(data_dir, "wal")))
    run = subprocess.run([sys.executable, "-m", "master", "--data-dir", data_dir, "--insecure",
                          "--bind", cluster.master_addr, "--rebuild-from-datanodes",
                          cluster.nodes[0].addr], capture_output=True, timeout=30)
    assert run.returncode == 1
    assert b"already holds a master's WAL" in run.stderr
    assert sorted(os.listdir(os.path.join(data_dir, "wal"))) == before


def test_bad_metadata_requests_and_puts_are_refused(cluster_factory):
    cluster = cluster_factory(datanodes=1, replication=1, **FAST)
    with Client(cluster.master_addr, timeout_s=10) as c:
        c.enqueue("q", b"x")
    with pytest.raises(Forbidden):  # a client key may not read the metadata
        node_metas(cluster, 0, "client")
    ep = cluster.endpoint(cluster.nodes[0].addr, "admin")
    try:
        for limit in (0, 5001, -1):
            with pytest.raises(InvalidArgument):
                call(ep, p.ListMeta(0, limit), 5)
        page = call(ep, p.ListMeta(p.MAX_ID, 10), 5)
        assert page.done and page.metas == [] and page.id_hi > 1
    finally:
        ep.close()
    # A relay between nodes with metadata naming an id it does not carry, or a bad queue
    node = cluster.endpoint(cluster.nodes[0].addr, "datanode")
    try:
        for meta in ([p.ItemMeta([2**40 + 1], "q", 0, 0.0, "", 0, "")],
                     [p.ItemMeta([], "bad queue!", 0, 0.0, "", 0, "")],
                     [p.ItemMeta([], "q", 0, float("nan"), "", 0, "")]):
            with pytest.raises(InvalidArgument):
                call(node, p.Put([2**40], [b"x"], [0x8CDC1683], [], 1, "", False, None, meta), 5)
    finally:
        node.close()
    kept = node_metas(cluster, 0)
    assert len(kept) == 1 and 2**40 not in kept  # the enqueued item's, nothing from above
