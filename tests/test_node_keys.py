"""Each data node has a key of its own: one node's key is not the whole cluster.

Real secure clusters; the attacker holds one data node's key (``cluster.endpoint(addr,
"datanode")`` speaks with data node 0's own key) and sends what a node may send, forged.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from blizzard import Client
from blizzard.net import keys as k
from blizzard.net.transport import call
from blizzard.server.capability import sign_get
from blizzard.wire import protocol as p
from blizzard.wire.errors import AuthenticationFailed, Forbidden
from master.ha.epoch_proof import EpochProof

from support.wait import wait_for

pytestmark = pytest.mark.cluster  # real clusters, some started here


def node_status(cluster, i: int) -> p.NodeStatus:
    """What the master says of data node ``i`` (by its address)."""
    return next(n for n in cluster.status().nodes if n.addr == cluster.nodes[i].addr)


def heartbeat(cluster, node_id: str, addr: str, **fields) -> object:
    """A heartbeat sent with data node 0's key; the master's reply (errors raised)."""
    ep = cluster.endpoint(cluster.master_addr, "datanode")
    try:
        return call(ep, p.Heartbeat(node_id, addr, 0, 0, 10**12, cluster.status().cluster_id,
                                    **fields), 5)
    finally:
        ep.close()


def test_a_heartbeat_with_an_invented_node_id_gets_no_key_ring(cluster):
    with pytest.raises(Forbidden, match="speaks for"):
        heartbeat(cluster, "dn-invented", "tcp://127.0.0.1:1")
    assert "dn-invented" not in {n.node_id for n in cluster.status().nodes}


def test_one_node_key_cannot_pose_as_another_node(cluster):
    other = node_status(cluster, 1)
    with pytest.raises(Forbidden, match="speaks with another key"):
        heartbeat(cluster, other.node_id, other.addr)
    assert node_status(cluster, 1).alive


def test_a_node_key_claiming_a_huge_epoch_fences_nobody(cluster_factory):
    cl = cluster_factory(datanodes=2, replication=2, heartbeat_s=0.2, dead_after_s=1.5,
                         standby=True)
    own = node_status(cl, 0)  # the key's own node id: accepted, its epoch claim is not
    for proof in [b"", b"\x00" * 16, EpochProof(b"not the masters' key").make(
            cl.status().cluster_id, 10**9)]:
        reply = heartbeat(cl, own.node_id, own.addr, epoch=10**9, epoch_proof=proof)
        assert isinstance(reply, p.HeartbeatReply) and reply.epoch == 0
    assert cl.master.alive and cl.second.alive
    assert "without the masters' proof" in cl.master.tail()
    with Client(cl.masters, timeout_s=10) as c:
        c.enqueue("after", b"still served")
        assert c.dequeue("after", wait_s=5).data == b"still served"


def test_a_node_key_cannot_delete_blobs_on_another_node(cluster_factory):
    cl = cluster_factory(datanodes=2, replication=2, heartbeat_s=0.2, dead_after_s=1.5)
    with Client(cl.master_addr, timeout_s=10) as c:
        ids = c.enqueue_many("kept", [b"a", b"b"])
    ep = cl.endpoint(cl.nodes[1].addr, "datanode")  # node 0's key, at node 1
    try:
        with pytest.raises(Forbidden, match="only its own blobs"):
            call(ep, p.Delete(ids, None), 5)
    finally:
        ep.close()
    cl.nodes[0].kill()  # the only copies left are node 1's
    with Client(cl.master_addr, timeout_s=10) as c:
        got = c.dequeue_many("kept", 10, wait_s=5)
        assert sorted(m.data for m in got) == [b"a", b"b"]


def test_a_removed_node_key_is_refused_and_its_open_connection_closed(cluster):
    name = cluster.node_key(2)[len(k.NODE_PREFIX):]
    ep = cluster.endpoint(cluster.master_addr, "datanode")  # an open connection of node 0's key
    assert isinstance(call(ep, p.Ping(), 5), p.Ok)
    k.remove_node(cluster.keys, name)
    k.remove_node(cluster.keys, cluster.node_key(0)[len(k.NODE_PREFIX):])
    try:
        wait_for(lambda: not node_status(cluster, 2).alive, what="node 2's heartbeats refused")
        wait_for(lambda: "the master refuses this node" in cluster.nodes[2].tail(),
                 what="node 2 to say why it is refused")
        with pytest.raises(AuthenticationFailed, match="revoked"):
            call(ep, p.Ping(), 5)
    finally:
        ep.close()
    assert node_status(cluster, 1).alive  # the other nodes are not touched


def test_a_data_node_without_a_key_of_its_own_says_how_to_make_one(cluster, tmp_path):
    keys = str(tmp_path / "keys")
    k.generate(keys)  # an old key directory: the shared datanode pair only
    out = subprocess.run([sys.executable, "-m", "datanode", "--data-dir", str(tmp_path / "d"),
                          "--bind", "tcp://127.0.0.1:1", "--master", cluster.master_addr,
                          "--keys", keys], capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    (line,) = [x for x in out.stderr.splitlines() if x.startswith("Error:")]
    assert "blizzard keys add-node" in line


def test_node_keys_are_added_listed_and_removed_alone(tmp_path):
    keys = str(tmp_path / "keys")
    k.generate(keys)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "blizzard.cli", "keys", *args],
                              capture_output=True, text=True, timeout=30)

    assert run("add-node", keys, "rack1-a").returncode == 0
    assert run("add-node", keys, "rack1-b").returncode == 0
    assert run("add-node", keys, "rack1-a").returncode == 1  # no silent replacement
    bad = run("add-node", keys, "../escape")
    assert bad.returncode == 1 and "letters, digits" in bad.stderr
    assert k.node_names(keys) == ["rack1-a", "rack1-b"]
    roles = k.authorized(keys)
    assert sorted(roles.values()) == ["admin", "client", "master", "node", "node"]
    assert run("remove-node", keys, "rack1-a").returncode == 0
    assert k.node_names(keys) == ["rack1-b"]
    assert not os.path.exists(os.path.join(keys, "datanode-rack1-a.key"))
    assert run("remove-node", keys, "rack1-a").returncode == 1


def test_a_wiped_node_comes_back_under_a_new_id_with_its_key(cluster):
    old = node_status(cluster, 2)
    cluster.nodes[2].kill()
    cluster.restart_node(2, wipe=True)  # a new disk: a new node id, the same key
    wait_for(lambda: any(n.alive and n.addr == old.addr and n.node_id != old.node_id
                         for n in cluster.status().nodes),
             timeout_s=20, what="the wiped node to join under a new id")
    assert "moved from " + old.node_id in cluster.master.tail()


def test_a_restarted_master_remembers_which_key_speaks_for_which_node(cluster_factory):
    cl = cluster_factory(datanodes=2, replication=1, heartbeat_s=0.2, dead_after_s=1.5)
    other = node_status(cl, 1)
    cluster_id = cl.status().cluster_id
    for node in cl.nodes:
        node.kill()
    cl.master.stop()  # a clean stop: the binding comes back from the checkpoint
    cl.restart_master()
    # Node 1 has not heartbeated to this master since: only the durable binding refuses
    ep = cl.endpoint(cl.master_addr, "datanode")
    try:
        with pytest.raises(Forbidden, match="speaks with another key"):
            call(ep, p.Heartbeat(other.node_id, other.addr, 0, 0, 10**12, cluster_id), 5)
    finally:
        ep.close()


def test_one_nodes_capability_keys_sign_no_grant_another_node_takes(cluster_factory):
    cl = cluster_factory(datanodes=2, replication=2, heartbeat_s=0.2, dead_after_s=1.5)
    with Client(cl.master_addr, timeout_s=10) as c:
        ids = c.enqueue_many("secret", [b"payroll", b"passwords"])
    own, other = node_status(cl, 0), node_status(cl, 1)
    learned = heartbeat(cl, own.node_id, own.addr).keys  # all that node 0's key is told
    ep = cl.endpoint(cl.nodes[1].addr, "client")
    try:
        for key in learned:  # whichever key it tries, signing for node 1
            expiry = time.time() + 60
            forged = p.GetGrant(ids, [other.node_id], key.key_id, expiry,
                                sign_get(key.key, key.key_id, expiry, ids, [other.node_id]))
            with pytest.raises(Forbidden, match="does not verify|unknown"):
                call(ep, p.Get(ids, forged), 5)
    finally:
        ep.close()
    with Client(cl.master_addr, timeout_s=10) as c:  # the real grants still read them
        got = c.dequeue_many("secret", 10, wait_s=5)
        assert sorted(m.data for m in got) == [b"passwords", b"payroll"]


def test_a_node_key_reports_on_its_own_node_only(cluster):
    other = node_status(cluster, 1)
    ep = cluster.endpoint(cluster.master_addr, "datanode")  # node 0's key
    try:
        for msg in [p.Inventory(other.node_id, [], True), p.PutReport(other.node_id, [1], [], ""),
                    p.Replicated(other.node_id, node_status(cluster, 2).node_id, [1], [])]:
            with pytest.raises(Forbidden, match="does not speak for"):
                call(ep, msg, 5)
    finally:
        ep.close()
    with Client(cluster.master_addr, timeout_s=10) as c:  # the nodes' own reports still count
        c.enqueue("own", b"x")
        assert c.dequeue("own", wait_s=5).data == b"x"


def test_a_node_key_cannot_rewrite_the_replicas_of_an_item(cluster_factory):
    """A copy between data nodes carries no grant (the node's key vouches for it); it may fill
    in a blob a node lacks, never replace one the node holds intact. Before, one node's key
    rewrote every replica of a committed item and it could never be read again."""
    import zlib

    cl = cluster_factory(datanodes=2, replication=2, heartbeat_s=0.2, dead_after_s=1.5)
    with Client(cl.master_addr, timeout_s=10) as c:
        (item,) = c.enqueue_many("victim", [b"the real payload"])
    evil = b"not what was enqueued"
    for node in cl.nodes:  # node 0's key, at both nodes
        ep = cl.endpoint(node.addr, "datanode")
        try:
            reply = call(ep, p.Put([item], [evil], [zlib.crc32(evil)], [], 1, "", False, None), 5)
        finally:
            ep.close()
        assert isinstance(reply, p.Stored)  # it is held there: nothing to write
    with Client(cl.master_addr, timeout_s=10) as c:
        (msg,) = c.dequeue_many("victim", 1, wait_s=5)
        assert msg.data == b"the real payload"


def test_blobs_a_node_key_plants_on_another_node_are_deleted_in_time(cluster_factory):
    """A copy between nodes carries no grant, so a node's key can store blobs under ids no
    item has; the receiving node reports its copies to the master after --copy-confirm-s,
    and the master deletes those it did not order: every stored id is reported in a bound.
    A real copy (repair after a node died) is kept."""
    import zlib

    cl = cluster_factory(datanodes=3, replication=2, heartbeat_s=0.2, dead_after_s=1.5,
                         node_args=["--copy-confirm-s", "1"])
    with Client(cl.master_addr, timeout_s=10) as c:
        kept = c.enqueue_many("kept", [b"x", b"y"])
    wait_for(lambda: sum(n.items for n in cl.status().nodes) == 4, what="the blobs counted")
    before = node_status(cl, 1).items
    planted = list(range(5_000_000, 5_000_010))
    blob = b"planted"
    ep = cl.endpoint(cl.nodes[1].addr, "datanode")  # node 0's key, at node 1
    try:
        reply = call(ep, p.Put(planted, [blob] * 10, [zlib.crc32(blob)] * 10, [], 1, "",
                               False, None), 5)
        assert isinstance(reply, p.Stored)
    finally:
        ep.close()
    # stored (counted at its next heartbeat), then deleted once reported to the master
    wait_for(lambda: node_status(cl, 1).items == before + 10, what="the planted blobs stored")
    wait_for(lambda: node_status(cl, 1).items == before, timeout_s=15,
             what="the planted blobs to be deleted")
    with Client(cl.master_addr, timeout_s=10) as c:  # the items are whole
        got = c.dequeue_many("kept", 10, wait_s=5)
        assert sorted(m.id for m in got) == sorted(kept)
