"""Operator removals on real clusters: forget a dead data node, delete an item, delete a queue.

The CLI parts run the real ``blizzard`` command; every removal must hold after a master restart.
"""

from __future__ import annotations

import json
import time

import pytest

from blizzard import Client
from blizzard.net.transport import raise_if_error
from blizzard.wire import protocol as p
from blizzard.wire.errors import InUse, MasterStarting, UnknownItem, UnknownQueue
from master.config import MasterConfig
from master.log.wal import MemoryWal
from master.server import MasterServer
from master.state import records
from master.state.machine import State
from master.state.records import CommitItems, NodeSeen

from support.cli import run
from support.in_process_master import (
    NoRouter,
    alloc,
    call,
    enqueue_msg,
    in_process_master,
    join,
    place,
    report,
    waiting_replies,
)
from support.wait import wait_for

FAST = dict(heartbeat_s=0.2, dead_after_s=1.5)


def fails(*args: str, master: str) -> str:
    """The one-line error of a command that must fail with exit 1."""
    proc = run(*args, master=master, check=False)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    (line,) = proc.stderr.decode().strip().splitlines()
    return line


def test_removing_a_dead_node_rereplicates_its_items_for_good(cluster_factory):
    cl = cluster_factory(datanodes=3, replication=2, **FAST)
    m = cl.master_addr
    payloads = {b"item-%d" % i for i in range(40)}
    with Client(m, timeout_s=10) as c:
        c.enqueue_many("jobs", sorted(payloads))
    by_addr = {proc.addr: proc for proc in cl.nodes}
    nodes = {n.node_id: by_addr[n.addr] for n in cl.wait_ready().nodes}
    victim = sorted(nodes)[0]
    # A live node is refused, and so is a node nobody knows
    assert "InUse" in fails("node", "remove", victim, master=m)
    assert "is alive" in fails("node", "remove", victim, master=m)
    assert "no data node" in fails("node", "remove", "dn-nobody", master=m)
    # Given the node killed and seen dead
    nodes[victim].kill()
    wait_for(lambda: not next(n.alive for n in cl.status().nodes if n.node_id == victim),
             what="the node seen dead")
    # When it is removed
    out = run("node", "remove", victim, master=m).stdout.decode()
    assert out.startswith(f"removed data node {victim};") and "items had a replica" in out
    # Then status no longer lists it, every item gets back to two replicas elsewhere
    assert victim not in [n.node_id for n in cl.status().nodes]
    wait_for(lambda: cl.status().under_replicated == 0, timeout_s=30, what="re-replication")
    # And that holds after a master restart: no replica of any item is on the removed node
    cl.master.kill()
    cl.restart_master()
    cl.wait_ready(nodes=2)
    assert victim not in [n.node_id for n in cl.status().nodes]
    with Client(m, timeout_s=10) as c:
        leased = c.lease("jobs", 100, lease_s=60)
        assert len(leased) == 40
        assert all(victim not in [r.node_id for r in i.nodes] and len(i.nodes) == 2
                   for i in leased)
        got, failed = c.fetch(leased)
        assert not failed and set(got.values()) == payloads


def enqueue(m: str, *data: str, delay: str = "0") -> list[int]:
    return [int(i) for i in run("enqueue", "jobs", *data, "--delay-s", delay,
                                master=m).stdout.split()]


def test_delete_one_item_ready_delayed_leased_or_dead(cluster_factory):
    cl = cluster_factory(datanodes=2, replication=2, **FAST)
    m = cl.master_addr
    run("queue", "config", "jobs", "--max-attempts", "1", master=m)
    ready, dead, dead_too = enqueue(m, "ready", "dies", "dies too")
    (delayed,) = enqueue(m, "delayed", delay="3600")
    with Client(m, timeout_s=10) as c:
        (leased,) = c.lease("jobs", 1, lease_s=600)  # the head: "ready"
        c.nack_many(c.lease("jobs", 2, lease_s=600), delay_s=0, error="boom")  # both die
    assert leased.id == ready
    (kept,) = enqueue(m, "still here")
    # A leased item is refused without --force; an unknown id, or one of another queue, too
    assert "InUse" in fails("delete", "jobs", str(ready), master=m)
    assert "UnknownItem" in fails("delete", "jobs", "999999", master=m)
    assert "UnknownItem" in fails("delete", "other", str(kept), master=m)
    # The delayed one, the dead ones (by the queue they died in, or their dead-letter queue)
    # and, forced, the leased one go
    for queue, item_id, force in [("jobs", delayed, []), ("jobs", dead, []),
                                  ("jobs.dead", dead_too, []), ("jobs", ready, ["--force"])]:
        assert run("delete", queue, str(item_id), *force, master=m).stdout.decode() == \
            f"deleted item {item_id} of {queue}\n"
    assert "UnknownItem" in fails("delete", "jobs", str(dead), master=m)  # gone already

    def counts() -> tuple:
        with Client(m, timeout_s=10) as c:
            s, d = c.stats("jobs"), c.stats("jobs.dead")
        return s["ready"], s["delayed"], s["leased"], s["dead"], d["ready"]
    assert counts() == (1, 0, 0, 0, 0)
    # Their blobs are deleted on the data nodes: only "still here" is left, on both
    wait_for(lambda: [n.items for n in cl.status().nodes] == [1, 1], what="blobs deleted")
    # After a crash (WAL replay) and a clean restart (checkpoint) they stay deleted
    cl.master.kill()
    cl.restart_master()
    assert counts() == (1, 0, 0, 0, 0)
    cl.master.stop()
    cl.restart_master()
    assert counts() == (1, 0, 0, 0, 0)
    with Client(m, timeout_s=10, admin=True) as c:
        assert [msg.data for msg in c.peek("jobs", 10)] == [b"still here"]
        with pytest.raises(UnknownItem):
            c.delete("jobs", ready)
        c.delete("jobs", kept)  # the client method
        assert c.stats("jobs")["ready"] == 0


def test_delete_a_queue_refuses_one_with_items_unless_forced(cluster_factory):
    cl = cluster_factory(datanodes=2, replication=1, **FAST)
    m = cl.master_addr
    run("queue", "config", "jobs", "--lease-s", "77", master=m)
    enqueue(m, "a", "b", "c")
    with Client(m, timeout_s=10) as c:
        c.lease("jobs", 1, lease_s=600)
        c.create_queue("empty")
    # A queue with items is refused, and one that does not exist
    line = fails("queue", "delete", "jobs", master=m)
    assert "InUse" in line and "3 items (1 leased)" in line
    assert "UnknownQueue" in fails("queue", "delete", "nothing", master=m)
    # Forced, it goes with its items (the leased one too) and says how many
    assert run("queue", "delete", "jobs", "--force", master=m).stdout.decode() == \
        "deleted queue jobs and its 3 items\n"
    assert run("queue", "delete", "empty", master=m).stdout.decode() == \
        "deleted queue empty and its 0 items\n"
    listed = json.loads(run("queue", "list", "--json", master=m).stdout)["queues"]
    assert listed == []
    wait_for(lambda: sum(n.items for n in cl.status().nodes) == 0, what="blobs deleted")
    # It stays deleted after a crash and after a clean restart; a new queue of that name
    # starts with default settings
    for how in ("kill", "stop"):
        getattr(cl.master, how)()  # the master of the moment: restart_master makes a new one
        cl.restart_master()
        with Client(m, timeout_s=10, admin=True) as c:
            assert c.queues() == []
            with pytest.raises(UnknownQueue):
                c.delete_queue("jobs")
    with Client(m, timeout_s=10, admin=True) as c:
        c.enqueue("jobs", b"new")
        assert c.queue_config("jobs")["lease_s"] != 77
        with pytest.raises(InUse):
            c.delete_queue("jobs")
        assert c.delete_queue("jobs", force=True) == 1


def test_a_node_with_an_items_only_replica_is_not_removed_and_replay_agrees():
    """In process: the refusals a cluster makes awkward to reach, and the records' replay."""
    server = in_process_master(replication=2)
    join(server, "dn-b", 2)
    now = time.time()
    server.log_record(CommitItems("q", [1, 2, 3], [1] * 3, [0] * 3, [0] * 3, [0.0] * 3,
                                  [""] * 3, False, ["dn-a", "dn-b"], now, ""))
    server.log_record(CommitItems("q", [4], [1], [0], [0], [0.0], [""], False, ["dn-a"], now, ""))
    later = time.monotonic() + 60  # both nodes long silent: dead

    def remove(node: str, mono: float):
        return server.handle(b"admin", 1, p.RemoveNode(node), time.time(), mono)
    assert "only replica of 1 items" in remove("dn-a", later).message
    assert remove("dn-a", later).code == InUse.code
    assert raise_if_error(server.handle(b"admin", 1, p.DeleteItem("q", 4, False), now,
                                        later)) == p.Removed(1)
    assert raise_if_error(remove("dn-a", later)) == p.Removed(3)
    assert [server.state.items[i].nodes for i in (1, 2, 3)] == [("dn-b",)] * 3
    assert "dn-a" not in server.state.node_addrs and "dn-a" not in server.membership.nodes
    server.wal.flush()
    replayed = State()
    for body in server.wal.replay():
        replayed.apply(records.unpack(body))
    assert replayed.snapshot() == server.state.snapshot()
    # A master that just started refuses until its nodes have had their time to report
    fresh = MasterServer(MasterConfig(data_dir="unused"), wal=MemoryWal(), router=NoRouter())
    fresh.log_record(NodeSeen("dn-c", "tcp://127.0.0.1:3"))
    assert fresh.handle(b"admin", 1, p.RemoveNode("dn-c"), time.time(),
                                            time.monotonic()).code == MasterStarting.code


UNSET = dict.fromkeys(p.fields_of(p.Configure))


def test_a_queue_with_enqueues_on_their_way_in_is_deleted_only_when_forced():
    """Staged and parked enqueues are not in the queue yet, but their commit would make it
    again with default settings: a delete must not overlook them."""
    server = in_process_master(replication=1)
    call(server, p.Configure(**UNSET | {"queue": "jobs", "create": True, "max_attempts": 2}))
    staged = alloc(server, 3, queue="jobs")
    parked = place(server, 2)  # placed, its enqueue waits for the node's report
    assert call(server, enqueue_msg(parked.ids, queue="jobs", request="parked")) is None
    # Unforced, the delete is refused and changes nothing
    refused = server.handle(b"admin", 1, p.DeleteQueue("jobs", False), time.time(),
                            time.monotonic())
    assert refused.code == InUse.code and "has 5 items on their way in" in refused.message
    assert server.state.config("jobs").max_attempts == 2
    # Forced, the queue goes and so do they: the commit and the enqueue fail, blobs are deleted
    assert call(server, p.DeleteQueue("jobs", True)) == p.Removed(0)
    with pytest.raises(UnknownItem):
        call(server, p.Commit(staged.ids, ["dn-a"], "c1"))
    report(server, parked.ids)
    (failed,) = waiting_replies(server)
    assert failed.code == UnknownItem.code
    assert "jobs" not in server.state.queues and server.enqueues.count("jobs") == 0
    assert set(server.deletes.take("dn-a")) == {*staged.ids, *parked.ids}
    server.close()


def test_a_removed_node_never_comes_back_as_a_replica():
    """Copies to it in flight, staged batches naming it and its earlier put reports must not
    make it a replica again: it would have no address."""
    server = in_process_master(replication=2, min_replicas=1)
    join(server, "dn-b", 2)
    now, mono = time.time(), time.monotonic()
    server.log_record(CommitItems("q", [1], [1], [0], [0], [0.0], [""], False, ["dn-a"], now, ""))
    for node, held in [("dn-a", [1]), ("dn-b", [])]:  # both done with their inventories
        assert call(server, p.Inventory(node, held, True), node.encode()) == p.Ok()
    # Given a copy of item 1 ordered to dn-b, an item staged on dn-a and dn-b, and a placed
    # id that dn-b reported stored
    server.repair.rescan()
    server.repair.plan(mono)
    assert server.repair.in_flight[1][1:] == ("dn-a", "dn-b")
    both = place(server, 1)
    assert sorted(n.node_id for n in both.nodes) == ["dn-a", "dn-b"]
    report(server, both.ids, "dn-a")
    report(server, both.ids, "dn-b")
    assert call(server, enqueue_msg(both.ids, request="s", hold=True)) == \
        p.Stored(["dn-a", "dn-b"])
    placed = place(server, 1)
    report(server, placed.ids, "dn-b")
    # When dn-b, long silent, is removed
    assert raise_if_error(server.handle(b"admin", 1, p.RemoveNode("dn-b"), now,
                                        mono + 60)) == p.Removed(0)
    assert server.repair.take_orders("dn-a") == []
    # Then the late confirmation of the copy, a commit naming dn-b and the enqueue of the id
    # it reported leave it out
    assert call(server, p.Replicated("dn-a", "dn-b", [1], [])) == p.Ok()
    assert call(server, p.Commit(both.ids, ["dn-a", "dn-b"], "c")) == p.Committed(1)
    report(server, placed.ids, "dn-a")
    assert call(server, enqueue_msg(placed.ids, request="e")) == p.Committed(1)
    assert [server.state.items[i].nodes for i in [1, *both.ids, *placed.ids]] == \
        [("dn-a",)] * 3
    server.close()
