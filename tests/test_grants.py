"""A secure data node serves puts, gets and deletes only with the master's grant (or a node key).

The unit tests drive a ``DatanodeServer`` in process (a memory store, replies and reports
captured); the last test runs a master and two secure data nodes in threads over real
sockets while the capability keys rotate every second.
"""

from __future__ import annotations

import threading
import time
import zlib

import pytest
import zmq

from blizzard.client.core import Client
from blizzard.local.harness import free_port
from blizzard.net import keys as k
from blizzard.net.transport import Endpoint, call
from blizzard.wire import protocol as p
from blizzard.wire.errors import Forbidden
from datanode.config import DatanodeConfig
from datanode.server import DatanodeServer
from datanode.store import MemoryStore
from master.config import MasterConfig
from master.nodes.grant_keys import CapabilityKeys
from master.server import MasterServer

from support.wait import wait_for

BLOB = b"payload"
CRC = zlib.crc32(BLOB)


class Node:
    """A secure data node in process: what it replied, what it reported to the master."""

    def __init__(self, tmp_path, keys: str | None = "keys") -> None:
        if keys:
            k.generate(str(tmp_path / keys))
            k.add_node(str(tmp_path / keys), "n")  # the node's own key
        self.server = DatanodeServer(DatanodeConfig(
            data_dir=str(tmp_path), bind=f"tcp://127.0.0.1:{free_port()}",
            keys=str(tmp_path / keys) if keys else None), zmq.Context(), store=MemoryStore())
        self.replies: list[object] = []
        self.reports: list[object] = []
        self.server.router.reply = lambda peer, rid, msg: self.replies.append(msg)
        self.server._report = self.reports.append
        self.id = self.server.node_id

    def hears(self, keys: CapabilityKeys) -> None:
        """A heartbeat reply from the master reaches the node."""
        self.server._obey(p.HeartbeatReply([], [], False, keys.keys_for(self.id)))

    def ask(self, msg, peer: bytes = b"client") -> object:
        """One request in one loop pass; its reply, if it had one."""
        self.replies.clear()
        self.server._handle([(peer, 1, msg)])
        return self.replies[-1] if self.replies else None

    def put(self, ids, grant, *, report: bool = True, peer: bytes = b"client") -> object:
        n = len(ids)
        return self.ask(p.Put(list(ids), [BLOB] * n, [CRC] * n, [], 1, self.id, report, grant),
                        peer)


@pytest.fixture
def keys() -> CapabilityKeys:
    return CapabilityKeys(None, 600.0, time.time())


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path)
    yield n
    n.server.close()


def put_grant(keys: CapabilityKeys, node: Node, first: int = 100, n: int = 10,
              expiry_s: float = 30.0) -> p.PutGrant:
    return keys.put_grant(first, n, [node.id, "dn-other"], time.time() + expiry_s)


def test_a_reported_put_with_its_grant_is_stored_and_reported(node, keys):
    node.hears(keys)
    assert node.put([100, 101], put_grant(keys, node)) is None  # reported puts get no reply
    assert node.reports == [p.PutReport(node.id, [100, 101], [], "")]
    assert node.server.store.count == 2


@pytest.mark.parametrize("grant, why", [
    (lambda k, n: None, "needs the master's grant"),
    (lambda k, n: put_grant(k, n, first=200), "does not cover these ids"),
    (lambda k, n: put_grant(k, n, expiry_s=-1), "expired"),
    (lambda k, n: k.put_grant(100, 10, ["dn-other"], time.time() + 30), "not for data node"),
    (lambda k, n: p.PutGrant(100, 10, [n.id], 2, time.time() + 30, b"forged-mac-here!"),
     "signature"),
], ids=["none", "other-ids", "expired", "other-node", "forged"])
def test_a_reported_put_without_a_valid_grant_is_refused_to_the_master(node, keys, grant, why):
    node.hears(keys)
    assert node.put([100, 101], grant(keys, node)) is None
    (report,) = node.reports
    assert report.ids == [] and report.failed == [100, 101] and why in report.error
    assert node.server.store.count == 0


def test_a_node_that_never_heard_from_the_master_refuses_every_grant(node, keys):
    node.put([100], put_grant(keys, node))
    assert "unknown here" in node.reports[0].error
    get = keys.get_grant([100], [node.id], time.time())
    assert node.ask(p.Get([100], get)).code == Forbidden.code


def test_a_get_needs_a_grant_for_its_ids_on_this_node(node, keys):
    node.hears(keys)
    node.put([100, 101, 102], put_grant(keys, node))
    now = time.time()
    reply = node.ask(p.Get([100, 102], keys.get_grant([100, 101, 102], [node.id], now)))
    assert reply == p.Blobs([100, 102], [BLOB, BLOB], [CRC, CRC], [])
    refused = [p.Get([100], None),
               p.Get([100, 103], keys.get_grant([100, 101, 102], [node.id], now)),
               p.Get([100], keys.get_grant([100], ["dn-other"], now)),
               p.Get([100], keys.get_grant([100], [node.id], now - 301))]
    for msg in refused:
        reply = node.ask(msg)
        assert isinstance(reply, p.Error) and reply.code == Forbidden.code, msg


def test_relays_between_data_nodes_need_no_grant_but_a_node_key(node, keys, monkeypatch):
    node.hears(keys)
    reply = node.put([7], None, report=False)
    assert reply.code == Forbidden.code and node.server.store.count == 0
    monkeypatch.setattr(node.server.gate, "role_of", lambda peer: "node" if peer == b"dn" else None)
    assert node.put([7], None, report=False, peer=b"dn") == p.Stored([node.id])
    assert node.put([8], None, report=False, peer=b"client").code == Forbidden.code


def test_a_delete_needs_an_admin_key_not_a_put_grant(node, keys, monkeypatch):
    node.hears(keys)
    grant = put_grant(keys, node)
    node.put([100, 101, 102], grant)
    assert node.ask(p.Delete([100], None)).code == Forbidden.code
    assert node.ask(p.Delete([100, 150], grant)).code == Forbidden.code
    # the grant outlives the enqueue of its ids: it deletes nothing (the master cleans up)
    assert node.ask(p.Delete([100], grant)).code == Forbidden.code
    monkeypatch.setattr(node.server.gate, "role_of", lambda peer: peer.decode())
    assert node.ask(p.Delete([101], None), peer=b"admin") == p.Ok()
    assert node.ask(p.Delete([102], None), peer=b"node").code == Forbidden.code  # another node
    assert node.server.store.count == 2


def test_a_granted_put_adds_blobs_only_and_always_reports(node, keys):
    node.hears(keys)
    grant = put_grant(keys, node)
    assert node.put([100], grant, report=False).code == Forbidden.code  # unheard of: refused
    assert node.server.store.count == 0
    node.put([100, 101], grant)
    node.reports.clear()
    node.put([100, 101], grant)  # a retry: reported again, nothing rewritten
    assert node.reports == [p.PutReport(node.id, [100, 101], [], "")]
    node.reports.clear()
    node.put([101, 102], grant)  # names a stored id: refused whole
    assert node.reports[0].failed == [101, 102] and "never replaces" in node.reports[0].error
    assert node.server.store.count == 2


def test_a_node_without_security_checks_no_grant(tmp_path):
    n = Node(tmp_path, keys=None)
    try:
        assert n.server.gate is None
        n.put([1], None)
        assert n.reports == [p.PutReport(n.id, [1], [], "")]
        assert n.ask(p.Get([1], None)) == p.Blobs([1], [BLOB], [CRC], [])
    finally:
        n.server.close()


# ---------------------------------------------------------------------------------------------
# A master and two secure data nodes, in threads, over real sockets


class Running:
    """Servers each looping in its own thread until ``stop``."""

    def __init__(self, servers: list) -> None:
        self.servers = servers
        self.threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        for s in self.servers:
            s.stop()
        for t in self.threads:
            t.join(5)
        for s in self.servers:
            s.close()


@pytest.fixture
def secure_cluster(tmp_path):
    """A master rotating its capability key every second, two secure data nodes, a client."""
    master_addr = f"tcp://127.0.0.1:{free_port()}"
    keys = str(tmp_path / "keys")
    k.generate(keys)
    for i in range(2):
        k.add_node(keys, f"dn{i}")
    ctx = zmq.Context()  # its own: one key directory per ZeroMQ context
    master = MasterServer(MasterConfig(
        data_dir=str(tmp_path / "master"), bind=master_addr, heartbeat_s=0.1, dead_after_s=1.0,
        pending_timeout_s=3.0, capability_key_s=1.0, keys=keys), ctx)
    nodes = [DatanodeServer(DatanodeConfig(
        data_dir=str(tmp_path / f"dn{i}"), bind=f"tcp://127.0.0.1:{free_port()}",
        master=master_addr, heartbeat_s=0.1, keys=keys, node_key=f"dn{i}"), ctx,
        store=MemoryStore())
        for i in range(2)]
    running = Running([master, *nodes])
    client = Client(master_addr, timeout_s=10.0, node_timeout_s=2.0, keys=keys, ctx=ctx)
    try:
        wait_for(lambda: sum(n.alive for n in client.status().nodes) == 2, what="data nodes")
        yield master, nodes, client
    finally:
        client.close()
        running.stop()


def test_keys_rotate_while_items_flow_and_nothing_is_lost(secure_cluster):
    master, nodes, client = secure_cluster
    first_key = master.capabilities.keys()[1].key_id
    sent: dict[int, bytes] = {}
    got: dict[int, bytes] = {}
    # When items are enqueued and dequeued through four rotations
    deadline = time.monotonic() + 20
    batch = 0
    while master.capabilities.keys()[1].key_id < first_key + 4:
        assert time.monotonic() < deadline, "the keys did not rotate"
        payloads = [f"item {batch}.{i}".encode() for i in range(20)]
        sent.update(zip(client.enqueue_many("rot", payloads), payloads, strict=True))
        msgs = client.dequeue_many("rot", 15)
        got.update((m.id, m.data) for m in msgs)
        client.ack_many(msgs)
        batch += 1
        time.sleep(0.05)
    while msgs := client.dequeue_many("rot", 100):
        got.update((m.id, m.data) for m in msgs)
        client.ack_many(msgs)
    # Then every item came out with its payload, and the nodes did check grants
    assert got == sent
    assert client.keys is not None
    ep = Endpoint(client.ctx, nodes[0].addr, client.keys, client.keys.datanode)
    try:
        with pytest.raises(Forbidden):
            call(ep, p.Get(list(sent)[:1], None), 5)
    finally:
        ep.close()


def test_a_client_with_a_bad_grant_hears_why(secure_cluster):
    master, nodes, client = secure_cluster
    # A put under a forged grant: the nodes refuse it to the master, the enqueue is unstored
    placement = call(client.master.endpoint, p.Place(1, []), 5)
    forged = p.replace(placement.grant, mac=bytes(16))
    client.datanodes.put_reported(placement.nodes, forged, placement.ids,
                                  [BLOB], [CRC], p.ItemMeta([], "bad", 0, 0.0, "", 0, ""))
    reply = call(client.master.endpoint, p.Enqueue("bad", placement.ids, [len(BLOB)], [CRC], [0],
                                                   [0.0], [""], False, "bad-1", False, 5.0,
                                                   placement.grant), 10)
    assert isinstance(reply, p.Unstored) and "signature" in reply.error
    # A read under a forged grant: every replica refuses it, and the client says so
    client.enqueue("bad", BLOB)
    (item,) = client.lease("bad", 1)
    item.grant = p.replace(item.grant, mac=bytes(16))
    client.datanodes.pushed = {}  # a read that asks the nodes, not one a node answered with
    reads = client.datanodes.read([item])
    assert reads.failed == [item] and not reads.bad
    error = reads.unreadable()
    assert isinstance(error, Forbidden) and "signature" in error.message


def test_a_lease_holder_gets_a_fresh_read_grant_when_the_first_one_ended(secure_cluster):
    master, nodes, client = secure_cluster
    ids = client.enqueue_many("late", [b"a", b"b"])
    leased = client.lease_columns("late", 2, lease_s=1.0)
    client.extend_ids(leased.ids, leased.leases, lease_s=60.0)  # held on, the grant is not
    ep = Endpoint(client.ctx, nodes[0].addr, client.keys, client.keys.datanode)
    try:
        def refused() -> bool:
            try:
                call(ep, p.Get(leased.ids, leased.grant), 5)
                return False
            except Forbidden as exc:
                return "expired" in exc.message
        wait_for(refused, timeout_s=10, what="the first grant to end")
        # Then a fresh grant reads them, and covers only what is still leased to the caller
        grant, lost = client.leases.regrant(leased.ids, leased.leases)
        assert (grant.ids, lost) == (leased.ids, [])
        assert call(ep, p.Get(leased.ids, grant), 5).blobs == [b"a", b"b"]
        client.ack_ids(leased.ids[:1], leased.leases[:1])
        grant, lost = client.leases.regrant(leased.ids, [leased.leases[0], leased.leases[1] + 7])
        assert (grant.ids, lost) == ([], [ids[1]])  # one acked (gone), one under another token
    finally:
        ep.close()
