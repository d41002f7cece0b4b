"""Cluster ids: made once by the master, kept by data nodes, refused across clusters.

Also what they are for: a second ``blizzard cluster`` on ports already in use starts nothing
and joins no data node to the first cluster.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
import zlib

import pytest

from blizzard import Client
from blizzard.local import harness
from blizzard.local.harness import LocalCluster, StartFailed, free_port
from blizzard.wire import protocol as p
from blizzard.wire.errors import ForeignCluster, InvalidArgument
from datanode.cluster_id import ClusterMembership
from datanode.store import LevelDbStore, MemoryStore
from master.config import MasterConfig
from master.log.wal import Wal
from master.server import MasterServer
from master.state import records
from master.state.machine import State

from support.cli import run
from support.in_process_master import NoRouter, in_process_master
from support.wait import wait_for

FAST = dict(heartbeat_s=0.2, dead_after_s=1.5)
BLIZZARD = [sys.executable, "-m", "blizzard.cli"]
CLUSTER_ID = re.compile(r"^[0-9a-f]{16}$")


def node_store_id(cluster: LocalCluster, i: int) -> str:
    """The cluster id in data node ``i``'s LevelDB (the node must be stopped)."""
    store = LevelDbStore(os.path.join(cluster.base_dir, f"datanode{i}", "blobs"))
    try:
        return (store.get_meta("cluster_id") or b"").decode()
    finally:
        store.close()


def test_the_master_keeps_its_id_and_every_node_keeps_the_one_it_joined(cluster_factory):
    cl = cluster_factory(datanodes=2, replication=2, **FAST)
    cluster_id = cl.status().cluster_id
    assert CLUSTER_ID.match(cluster_id)
    assert json.loads(run("status", "--json", master=cl.master_addr).stdout)["cluster_id"] == \
        cluster_id
    assert f"cluster: {cluster_id} (epoch 0; standby in sync: none)\n" in \
        run("status", master=cl.master_addr).stdout.decode()
    with Client(cl.master_addr, timeout_s=10) as c:
        c.enqueue("jobs", b"x")
    # The id survives a crash (WAL replay) and a clean stop (checkpoint) of the master
    cl.master.kill()
    cl.restart_master()
    assert cl.status().cluster_id == cluster_id
    cl.master.stop()
    cl.restart_master()
    assert cl.wait_ready(nodes=2).cluster_id == cluster_id
    for i, node in enumerate(cl.nodes):
        node.stop()
        assert node_store_id(cl, i) == cluster_id


def test_a_node_of_another_cluster_is_refused_and_not_registered(cluster_factory):
    first = cluster_factory(datanodes=1, replication=1, **FAST)
    second = cluster_factory(datanodes=1, replication=1, **FAST)
    assert first.status().cluster_id != second.status().cluster_id
    stray_id = second.status().nodes[0].node_id
    # Given the second cluster's node restarted with its --master pointing at the first master
    stray = second.nodes[0]
    stray.stop()
    argv = list(stray.argv)
    argv[argv.index("--master") + 1] = first.master_addr
    second.nodes[0] = type(stray)(stray.name, argv, stray.log_path, stray.addr).start()
    # Then the first master refuses it, saying why, once, and never lists it
    wait_for(lambda: "refuses this node" in second.nodes[0].tail(), what="the node's complaint")
    wait_for(lambda: "refusing data node" in first.master.tail(), what="the master's refusal")
    deadline = time.monotonic() + 1.0  # five more heartbeats of the stray node, all refused
    while time.monotonic() < deadline:
        assert stray_id not in [n.node_id for n in first.status().nodes]
    assert len(first.status().nodes) == 1
    with open(first.master.log_path) as f:
        assert f.read().count("refusing data node") == 1
    # And the node still belongs to its own cluster: pointed back, it serves there again
    second.nodes[0].stop()
    assert node_store_id(second, 0) == second.status().cluster_id
    second.nodes[0] = type(stray)(stray.name, stray.argv, stray.log_path, stray.addr).start()
    second.wait_ready(nodes=1)


def test_a_node_adopts_the_first_master_and_refuses_others(caplog):
    store = MemoryStore()
    membership = ClusterMembership(store)
    assert membership.cluster_id == ""  # a fresh node, or one from before cluster ids
    reply = p.HeartbeatReply([5], [], False, [], cluster_id="aaaa000011112222")
    assert membership.accepts(reply)
    assert store.get_meta("cluster_id") == b"aaaa000011112222"
    assert ClusterMembership(store).cluster_id == "aaaa000011112222"  # kept in the store
    # A master of another cluster, or one with no id, is not obeyed; each complaint logged once
    foreign = p.HeartbeatReply([5], [], True, [], cluster_id="bbbb000011112222")
    with caplog.at_level(logging.ERROR):
        for refused in [foreign, p.Error(ForeignCluster.code, "this master is of x"),
                        p.HeartbeatReply([5], [], True, [])]:
            assert [membership.accepts(refused) for _ in range(3)] == [False] * 3
    complaints = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(complaints) == 3
    assert "bbbb000011112222" in complaints[0] and "not obeying" in complaints[0]
    assert "this master is of x" in complaints[1] and "no cluster id" in complaints[2]
    assert store.get_meta("cluster_id") == b"aaaa000011112222"
    assert membership.accepts(reply)


def test_a_node_store_keeps_its_cluster_id_apart_from_its_blobs(tmp_path):
    path = str(tmp_path / "blobs")
    store = LevelDbStore(path)
    store.put_many([1, 2**63 - 1], [b"a", b"bb"], [0xE8B7BE43, 0x4D1C2B6B & 0xFFFFFFFF])
    store.put_meta("cluster_id", b"cccc000011112222")
    store.close()
    store = LevelDbStore(path)
    try:
        assert (store.count, store.bytes_used, list(store.ids())) == (2, 3, [1, 2**63 - 1])
        assert store.get_meta("cluster_id") == b"cccc000011112222"
    finally:
        store.close()


def test_a_master_data_dir_from_before_cluster_ids_gets_one(tmp_path):
    # Given a WAL written before cluster ids (no ClusterCreated record)
    wal = Wal(str(tmp_path / "wal"))
    list(wal.replay())
    wal.append(records.pack(records.Reserve(100)))
    wal.flush()
    wal.close()
    config = MasterConfig(data_dir=str(tmp_path))
    first = MasterServer(config, router=NoRouter())
    made = first.state.cluster_id
    assert CLUSTER_ID.match(made)
    first.run_once(0)  # the pass's fsync makes it durable
    first.wal.close()
    again = MasterServer(config, router=NoRouter())  # WAL replay
    assert again.state.cluster_id == made
    again.close()  # writes a checkpoint
    assert MasterServer(config, router=NoRouter()).state.cluster_id == made
    # A checkpoint header from before cluster ids reads as none
    header, *rows = State().export_parts()
    del header["cluster_id"]
    assert State.restore([header, *rows]).cluster_id == ""


@pytest.mark.cluster
def test_a_master_that_cannot_start_starts_no_data_node(tmp_path):
    cl = LocalCluster(str(tmp_path / "c"), datanodes=2, master_args=["--replication", "0"])
    try:
        with pytest.raises(StartFailed) as failed:
            cl.start(timeout_s=30)
    finally:
        cl.stop()
    assert failed.value.reason.startswith("master exited with 2: ")
    assert cl.nodes == []


def cli(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([*BLIZZARD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


@pytest.mark.cluster
def test_a_second_cluster_command_on_the_same_ports_fails_clearly(tmp_path):
    port, node_port = free_port(), free_port()
    ports = ["--port", str(port), "--node-port", str(node_port), "--datanodes", "2"]
    first = cli("cluster", "--data-dir", str(tmp_path / "one"), *ports)
    try:
        keys = str(tmp_path / "one" / "keys")
        wait_for(lambda: os.path.exists(os.path.join(keys, "admin.key_secret")),
                 what="the first cluster's keys")
        with Client(f"tcp://127.0.0.1:{port}", timeout_s=10, keys=keys) as c:
            def up() -> bool:
                try:
                    return sum(n.alive for n in c.status().nodes) == 2
                except Exception:
                    return False
            wait_for(up, timeout_s=30, what="the first cluster")
            # When a second cluster is started on the same ports
            second = cli("cluster", "--data-dir", str(tmp_path / "two"), *ports)
            out, err = second.communicate(timeout=60)
            # Then it fails with one clear line, prints no banner and starts nothing
            assert second.returncode == 1, (out, err)
            assert "export BLIZZARD_MASTER" not in out
            (line,) = err.strip().splitlines()
            assert f"port {port} on 127.0.0.1 is taken" in line
            assert not os.path.exists(tmp_path / "two" / "datanode0")
            # And the first cluster has its two nodes and no other
            st = c.status()
            assert len(st.nodes) == 2 and all(n.alive for n in st.nodes)
    finally:
        first.terminate()
        first.communicate(timeout=30)


def heartbeat(server: MasterServer, node: str, items: int, cluster_id: str = "", port: int = 9):
    """Data node ``node`` (holding ``items`` blobs) heartbeats through the master's gate."""
    msg = p.Heartbeat(node, f"tcp://127.0.0.1:{port}", items, items * 10, 10**12, cluster_id)
    return server.handle(node.encode(), 1, msg, time.time(), time.monotonic())


def test_an_unknown_node_with_blobs_and_no_id_is_refused_until_told_to_join():
    """A master that lost its data dir (or a node at the wrong address) must not adopt a node
    from before cluster ids and then order all its blobs deleted as strays."""
    server = in_process_master(replication=1)
    cluster_id = server.state.cluster_id
    # Given a node from before cluster ids, holding 5 blobs, new to this master
    refused = heartbeat(server, "dn-old", 5)
    assert refused.code == ForeignCluster.code
    assert "holds 5 blobs and no cluster id" in refused.message
    assert refused.message.endswith(f"restart it with --join-cluster {cluster_id}")
    # Then it is not registered, asked for no inventory, ordered to delete nothing
    assert "dn-old" not in server.membership.nodes and "dn-old" not in server.state.node_addrs
    server.tick(time.time(), time.monotonic())
    assert server.deletes.take("dn-old") == []
    # A node the master knows (a cluster upgraded from before ids), or one holding nothing,
    # adopts the id as before; a node started with --join-cluster sends the id and is served
    for node, items, given, port in [("dn-a", 5, "", 1), ("dn-new", 0, "", 2),
                                     ("dn-old", 5, cluster_id, 3)]:
        reply = heartbeat(server, node, items, given, port)
        assert isinstance(reply, p.HeartbeatReply) and reply.cluster_id == cluster_id, node
    assert reply.inventory and "dn-old" in server.state.node_addrs
    server.close()


@pytest.mark.cluster
def test_join_cluster_keeps_the_id_the_operator_gave(tmp_path):
    store = MemoryStore()
    assert ClusterMembership(store, "dddd000011112222").cluster_id == "dddd000011112222"
    assert store.get_meta("cluster_id") == b"dddd000011112222"
    assert ClusterMembership(store, "dddd000011112222").cluster_id == "dddd000011112222"
    with pytest.raises(InvalidArgument, match="belongs to cluster dddd000011112222"):
        ClusterMembership(store, "eeee000011112222")  # a node of a cluster stays in it
    assert store.get_meta("cluster_id") == b"dddd000011112222"
    # A bad id is refused by the command in one line, before anything starts
    proc = subprocess.run([sys.executable, "-m", "datanode", "--data-dir", str(tmp_path / "d"),
                           "--bind", f"tcp://127.0.0.1:{free_port()}", "--insecure",
                           "--join-cluster", "not-an-id"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert "--join-cluster takes a cluster id" in line


def test_data_nodes_start_only_once_our_own_master_serves(cluster_factory, tmp_path,
                                                         monkeypatch):
    """A free port may be taken between the probe and the master's bind; the master there
    answers too, and data nodes sent to it would join its cluster."""
    other = cluster_factory(datanodes=1, replication=1, **FAST)
    taken = int(other.master_addr.rsplit(":", 1)[1])
    # Given the port picked for our master is the other master's
    picks = iter([taken])
    monkeypatch.setattr(harness, "free_port", lambda: next(picks, 0) or free_port())
    cl = LocalCluster(str(tmp_path / "ours"), datanodes=2, replication=1, **FAST)
    sent_to: list[str] = []
    make_node = cl._node_proc
    monkeypatch.setattr(cl, "_node_proc",
                        lambda i, addr: sent_to.append(cl.master_addr) or make_node(i, addr))
    try:
        cl.start()  # our master fails to bind; the start is retried on a new port
        # Then no data node was ever pointed at the other master, and each cluster has its own
        assert other.master_addr not in sent_to and len(sent_to) == 2
        assert cl.master_addr != other.master_addr
        assert cl.status().cluster_id != other.status().cluster_id
        assert len(cl.status().nodes) == 2 and len(other.status().nodes) == 1
    finally:
        cl.stop()


def test_a_node_from_before_ids_with_blobs_joins_only_when_told(cluster_factory):
    cl = cluster_factory(datanodes=1, replication=1, **FAST)
    cluster_id = cl.status().cluster_id
    # Given a data dir from before cluster ids: three blobs, no id
    os.makedirs(os.path.join(cl.base_dir, "datanode1"))
    store = LevelDbStore(os.path.join(cl.base_dir, "datanode1", "blobs"))
    blobs = [b"a", b"b", b"c"]
    store.put_many([7, 8, 9], blobs, [zlib.crc32(b) for b in blobs])
    store.close()
    node = cl._node_proc(1, f"tcp://127.0.0.1:{free_port()}").start()
    cl.nodes.append(node)
    # Then the master refuses it, saying how to attach it, and it keeps its blobs and no id
    wait_for(lambda: f"--join-cluster {cluster_id}" in node.tail(), what="the node's complaint")
    assert "holds 3 blobs and no cluster id" in node.tail()
    assert len(cl.status().nodes) == 1
    node.stop()
    assert node_store_id(cl, 1) == ""
    # When the operator restarts it with --join-cluster, it joins
    cl.nodes[1] = type(node)(node.name, [*node.argv, "--join-cluster", cluster_id],
                             node.log_path, node.addr).start()
    assert len(cl.wait_ready(nodes=2).nodes) == 2
    cl.nodes[1].stop()
    assert node_store_id(cl, 1) == cluster_id
