"""Hostile frames against a real cluster: no server dies, nothing acknowledged is lost (P1, P7).

Each probe sends what any process on the network could send, then checks that every server
process is alive, that what the cluster holds is unchanged, and that a normal enqueue and
dequeue still work. One cluster (a master, two data nodes, R=2) serves the whole module.
"""

from __future__ import annotations

import os
import time
import uuid

import msgpack
import pytest
import zmq

from blizzard import Client
from blizzard.local.harness import LocalCluster
from blizzard.wire import protocol as p
from master.server import NODE_OPS

from support.wait import wait_for

pytestmark = pytest.mark.cluster  # a real cluster, started by a module fixture

CLUSTER: list[LocalCluster] = []  # the module's cluster, for sockets with its keys


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    c = LocalCluster(str(tmp_path_factory.mktemp("hostile")), datanodes=2, replication=2,
                     heartbeat_s=0.2, dead_after_s=1.5)
    c.start()
    CLUSTER[:] = [c]
    try:
        yield c
    finally:
        c.stop()


def dealer(addr: str, name: str | None = None) -> zmq.Socket:
    """A raw socket to one of the module cluster's servers. These probes test what a server
    does with what its peers may send, so by default the key is a peer's: a data node's
    towards data nodes, a client's towards the master."""
    cluster = CLUSTER[0]
    return cluster.dealer(addr, name or ("client" if addr == cluster.master_addr else "datanode"))


@pytest.fixture(scope="module")
def client(hostile):
    with Client(hostile.master_addr, timeout_s=15) as c:
        yield c


def send(addr: str, *frames: bytes, timeout_s: float = 5.0, name: str | None = None):
    """Send raw frames from a fresh DEALER; the decoded (request id, reply), or None if none."""
    sock = dealer(addr, name)
    try:
        sock.send_multipart(list(frames))
        if not sock.poll(int(timeout_s * 1000), zmq.POLLIN):
            return None
        return p.decode(sock.recv())
    finally:
        sock.close(linger=0)


def ask(addr: str, msg) -> object:
    """One encoded request (no client-side checks), its reply."""
    got = send(addr, p.encode(7, msg), name="datanode" if type(msg) in NODE_OPS else None)
    assert got is not None, f"no reply to {msg!r}"
    return got[1]


def body(*fields) -> bytes:
    return msgpack.packb(list(fields), use_bin_type=True)


def frame(op: int, *fields, rid: int = 1) -> bytes:
    """A frame of message ``op`` with ``fields`` as given, checked by nobody on the way."""
    return body(p.VERSION, rid, [op, *fields])


def nodes(cluster: LocalCluster) -> list[p.NodeStatus]:
    return sorted(cluster.status().nodes, key=lambda n: n.addr)


def assert_healthy(cluster: LocalCluster, client: Client) -> None:
    """Every process alive, both data nodes alive at their own addresses, an item round trips."""
    for proc in [cluster.master, *cluster.nodes]:
        assert proc.alive, f"{proc.name} died:\n{proc.tail()}"
    addrs = {proc.addr for proc in cluster.nodes}
    wait_for(lambda: {n.addr for n in cluster.status().nodes if n.alive} == addrs,
             what="the real data nodes alive, and no other")
    data = uuid.uuid4().bytes
    client.enqueue("probe", data)
    msg = client.dequeue("probe", wait_s=5)
    assert msg is not None and msg.data == data
    msg.ack()


def _log_since(cluster: LocalCluster, offset: int) -> str:
    """The master's log written after ``offset`` bytes."""
    with open(cluster.master.log_path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def error_code(reply) -> str:
    assert isinstance(reply, p.Error), f"expected an error, got {reply!r}"
    return reply.code


# -- crashes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("position", [0, 1, 2, 3])
def test_a_deeply_nested_field_gets_an_error_from_every_server(hostile, client, position):
    nested = b"\x91" * 1010 + b"\x01"
    parts = [msgpack.packb(p.VERSION), msgpack.packb(5), b"\x92\x14" + msgpack.packb("q")]  # Stats
    if position == 3:  # the message's one field
        parts[2] = b"\x92\x14" + nested
    else:
        parts[position] = nested
    hostile_frame = b"\x93" + b"".join(parts)
    for addr in [hostile.master_addr, *(n.addr for n in hostile.nodes)]:
        rid, reply = send(addr, hostile_frame)
        assert error_code(reply) in ("protocol", "version", "unknown_op")
        assert rid in (0, 5)
    assert_healthy(hostile, client)


@pytest.mark.parametrize("bad", [
    frame(42, [-1], None),  # Get([-1])
    frame(44, [-1], None),  # Delete([-1])
    frame(42, [2**64 - 1] * 9, None),  # Get past the key format
    frame(40, [-1], [b"x"], [0x8CDC1683], [], 1, "", False, None, []),  # Put([-1])
], ids=["get-negative", "delete-negative", "get-2**64-1", "put-negative"])
def test_out_of_range_ids_are_refused_by_data_nodes(hostile, client, bad):
    for node in hostile.nodes:
        _, reply = send(node.addr, bad)
        assert error_code(reply) == "protocol"
        assert "item id" in reply.message
    assert_healthy(hostile, client)


@pytest.mark.parametrize("addr", ["tcp://x", "ipc:///tmp/x", "tcp://nonexistent.invalid:5"])
def test_a_put_forwarding_to_a_bad_address_kills_nothing(hostile, client, addr):
    item_id = 2**40 + 17
    put = p.Put([item_id], [b"x"], [0x8CDC1683], [p.NodeRef("fake", addr)], 1, "", False,
                None)
    reply = ask(hostile.nodes[0].addr, put)
    if addr.count(":") < 2 or not addr.startswith("tcp://"):
        assert error_code(reply) == "invalid_argument"
    else:  # well-formed but unreachable: stored here, the forward simply failed
        assert isinstance(reply, p.Stored) and len(reply.nodes) == 1
    ask(hostile.nodes[0].addr, p.Delete([item_id], None))
    assert_healthy(hostile, client)


def test_an_inventory_with_negative_ids_is_refused_and_no_delete_order_follows(hostile, client):
    node = nodes(hostile)[0]
    reply = send(hostile.master_addr, frame(33, node.node_id, [-7], True),
                 name="datanode")[1]
    assert error_code(reply) == "protocol"
    probe_at = time.monotonic()
    # the node would have died on the delete order in its next heartbeat reply
    wait_for(lambda: time.monotonic() - probe_at > 1.0 and all(
        n.heartbeat_age_s < 0.5 for n in hostile.status().nodes), what="two heartbeats")
    assert_healthy(hostile, client)


@pytest.mark.parametrize("addr", ["tcp://x", "tcp://127.0.0.1:1"])
def test_a_heartbeat_cannot_move_a_live_node(hostile, client, addr):
    before = nodes(hostile)
    # the node whose key ``ask`` sends with (data node 0's): its own id, from elsewhere
    node = next(n for n in before if n.addr == hostile.nodes[0].addr)
    reply = ask(hostile.master_addr, p.Heartbeat(node.node_id, addr, 0, 0, 10**12))
    assert error_code(reply) == "invalid_argument"
    assert [(n.node_id, n.addr) for n in nodes(hostile)] == [(n.node_id, n.addr) for n in before]
    for _ in range(5):  # puts and re-replication go to the real nodes only
        assert_healthy(hostile, client)


def test_a_negative_request_id_is_not_echoed(hostile, client):
    for addr in [hostile.master_addr, hostile.nodes[0].addr]:
        rid, reply = send(addr, body(p.VERSION, -5, [22]))
        assert rid == 0 and error_code(reply) == "protocol"
    assert_healthy(hostile, client)


def test_a_request_with_several_body_frames_is_refused(hostile, client):
    rid, reply = send(hostile.master_addr, p.encode(1, p.Status()), p.encode(2, p.Status()))
    assert error_code(reply) == "protocol"
    assert_healthy(hostile, client)


# -- acknowledged enqueues -------------------------------------------------------------------


def tell(addr: str, msg) -> None:
    """Send one request that gets no reply (a reported put), making sure it leaves."""
    sock = dealer(addr)
    sock.send(p.encode(7, msg))
    sock.close(linger=5000)


def test_an_enqueue_with_an_oversized_request_id_changes_nothing(hostile, client):
    placement = ask(hostile.master_addr, p.Place(1, []))
    assert isinstance(placement, p.Placement) and len(placement.nodes) == 2
    for ref in placement.nodes:
        tell(ref.addr, p.Put(placement.ids, [b"a"], [0xE8B7BE43], [], 1, ref.node_id, True,
                             placement.grant))

    def enqueue(request: str) -> p.Enqueue:
        return p.Enqueue("big", placement.ids, [1], [0xE8B7BE43], [0], [0.0], [""], False,
                         request, False, 5.0, placement.grant)
    assert error_code(ask(hostile.master_addr, enqueue("r" * 1_000_000))) == "invalid_argument"
    assert client.stats("big")["ready"] == 0
    assert ask(hostile.master_addr, enqueue("ok-1")) == p.Committed(1)
    since = os.path.getsize(hostile.master.log_path)
    hostile.master.kill()
    hostile.restart_master()
    # the restarted master asks each data node for its inventory: until both are in, a node's
    # inventory is expected (the module's next tests send ones nobody asked for)
    wait_for(lambda: _log_since(hostile, since).count("inventory of dn-") >= len(hostile.nodes),
             what="the data nodes' inventories after the restart")
    msg = client.dequeue("big", wait_s=5)
    assert msg is not None and msg.data == b"a"
    msg.ack()
    assert_healthy(hostile, client)


def test_reports_never_drop_the_last_replica(hostile, client):
    item_id = client.enqueue("reports", b"precious")
    holders = [n.node_id for n in nodes(hostile)]  # R=2 on two nodes: both hold it
    # a client claims every replica is bad
    assert isinstance(ask(hostile.master_addr, p.BadReplica([item_id] * len(holders), holders)),
                      p.Ok)
    # a node that was not asked claims an empty inventory (of its own: ``ask`` sends with data
    # node 0's key, which speaks for no other node)
    own = next(n.node_id for n in nodes(hostile) if n.addr == hostile.nodes[0].addr)
    reply = ask(hostile.master_addr, p.Inventory(own, [], True))
    assert error_code(reply) == "invalid_argument"
    # someone reports a copy nobody ordered
    assert isinstance(ask(hostile.master_addr, p.Replicated(own, "dn-fake", [item_id], [])),
                      p.Ok)
    msg = client.dequeue("reports", wait_s=5)
    assert msg is not None and msg.id == item_id and msg.data == b"precious"
    msg.ack()
    assert_healthy(hostile, client)


# -- memory budgets --------------------------------------------------------------------------


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


MiB = 1024 * 1024


def test_a_frame_of_empty_arrays_is_refused_cheaply(hostile, client):
    flood = b"\x93" + msgpack.packb(p.VERSION) + b"\x01\x92\x0c" + b"\xdd" + \
        (4 * MiB).to_bytes(4, "big") + b"\x90" * (4 * MiB)  # a Commit of 4 Mi empty arrays
    node = hostile.nodes[0]
    for proc, addr in [(hostile.master, hostile.master_addr), (node, node.addr)]:
        before = rss_bytes(proc.popen.pid)
        started = time.monotonic()
        _, reply = send(addr, flood)
        assert error_code(reply) == "protocol"
        assert time.monotonic() - started < 1.0
        assert rss_bytes(proc.popen.pid) - before < 32 * MiB
    assert_healthy(hostile, client)


def test_a_frame_over_the_size_limit_is_dropped(hostile, client):
    big = b"\x00" * (p.MAX_FRAME_BYTES + 1)
    assert send(hostile.nodes[0].addr, big, timeout_s=1.0) is None  # ZeroMQ cut the connection
    assert send(hostile.master_addr, b"\x00" * (9 * MiB), timeout_s=1.0) is None
    assert_healthy(hostile, client)


def test_a_get_repeating_one_id_gets_it_once_and_a_reply_is_capped(hostile, client):
    blob = os.urandom(64 * 1024)
    ids = client.enqueue_many("wide", [blob] * 400)  # 25 MiB in all: more than one reply holds
    items = client.lease("wide", 400, wait_s=5)  # the lease brings the grant to read them
    assert sorted(item.id for item in items) == sorted(ids)
    grant = items[0].grant
    node = hostile.nodes[0]
    before = rss_bytes(node.popen.pid)
    reply = ask(node.addr, p.Get([ids[0]] * 10_000, grant))
    assert reply.ids == [ids[0]] and reply.blobs == [blob]
    reply = ask(node.addr, p.Get(ids, grant))
    assert 0 < len(reply.ids) < len(ids) and sum(map(len, reply.blobs)) <= 21 * MiB
    assert not reply.missing
    assert rss_bytes(node.popen.pid) - before < 2 * p.MAX_FRAME_BYTES + 32 * MiB
    payloads, failed = client.fetch(items)  # the client asks again for the rest
    assert not failed and sorted(payloads) == sorted(ids)
    assert all(data == blob for data in payloads.values())
    assert hostile.status().under_replicated == 0  # no replica taken for bad on the way
    client.ack_many(items)
    assert_healthy(hostile, client)


def test_long_polls_are_capped_per_connection(hostile, client):
    sock = dealer(hostile.master_addr)
    before = rss_bytes(hostile.master.popen.pid)
    try:
        for rid in range(1, 1001):
            sock.send(p.encode(rid, p.Lease("nobody-fills-me", 1, 1.0, 2.0, "", [], [])))
        refused = 0
        deadline = time.monotonic() + 10
        while refused < 1000 - 256 and time.monotonic() < deadline:
            if sock.poll(100, zmq.POLLIN):
                _, reply = p.decode(sock.recv())
                refused += isinstance(reply, p.Error) and reply.code == "too_many_items"
        assert refused == 1000 - 256
    finally:
        sock.close(linger=0)
    assert rss_bytes(hostile.master.popen.pid) - before < 32 * MiB
    assert_healthy(hostile, client)


def test_ids_held_without_enqueue_are_capped_per_connection(hostile, client):
    sock = dealer(hostile.master_addr)
    n = p.MAX_BATCH
    before = rss_bytes(hostile.master.popen.pid)
    try:
        codes = []
        for rid in range(1, 101):  # 1,000,000 ids asked for, never enqueued
            sock.send(p.encode(rid, p.Place(n, [])))
            assert sock.poll(10_000, zmq.POLLIN)
            reply = p.decode(sock.recv())[1]
            codes.append("ok" if isinstance(reply, p.Placement) else reply.code)
    finally:
        sock.close(linger=0)
    assert codes.count("ok") == 20 and codes.count("too_many_items") == 80
    assert rss_bytes(hostile.master.popen.pid) - before < 64 * MiB  # 200,000 ids held
    assert_healthy(hostile, client)


def test_puts_naming_many_replica_addresses_keep_peer_sockets_bounded(hostile, client):
    node = hostile.nodes[0]
    before = rss_bytes(node.popen.pid)
    for port in range(1, 1501):  # libzmq's default limit is 1,023 sockets
        ref = p.NodeRef("fake", f"tcp://127.0.0.1:{port}")
        put = p.Put([2**41 + port], [b"x"], [0x8CDC1683], [ref], 1, "", False, None)
        reply = ask(node.addr, put)
        assert isinstance(reply, p.Stored)
    ask(node.addr, p.Delete([2**41 + port for port in range(1, 1501)], None))
    assert rss_bytes(node.popen.pid) - before < 64 * MiB
    assert_healthy(hostile, client)
