"""Every id accounted for on a secure cluster: staged items are their stager's to commit, and
a put grant only ever adds blobs the master hears of (issue 32, items 4 and 5).

Requests are forged over the cluster's own keys (``LocalCluster.endpoint``), as an attacker
holding a client key would send them.
"""

from __future__ import annotations

import zlib

import pytest

from blizzard.client.core import Client
from blizzard.net.transport import call
from blizzard.spark.writer import covering
from blizzard.wire import protocol as p
from blizzard.wire.errors import Forbidden

from support.wait import wait_for


def _put(placement: p.Placement, node: p.NodeRef, blob: bytes, *, report: bool,
         grant: p.PutGrant | None = None) -> p.Put:
    """A producer's put of one blob under the placement's first id, with its metadata."""
    meta = [p.ItemMeta([], "acct", 0, 0.0, "", 0, "")]
    return p.Put([placement.first], [blob], [zlib.crc32(blob)], [], 1, node.node_id, report,
                 grant or placement.grant, meta)


def _held(cluster, node: p.NodeRef) -> set[int]:
    """The ids a data node holds (with their metadata), read with the admin key."""
    ep = cluster.endpoint(node.addr, "admin")
    try:
        ids: set[int] = set()
        start = 0
        for _ in range(1000):  # bounded: a page per call, ``next`` moves on
            page = call(ep, p.ListMeta(start, 1000), 10)
            ids.update(i for meta in page.metas for i in meta.ids)
            if page.done:
                return ids
            start = page.next
        raise AssertionError("ListMeta did not finish")
    finally:
        ep.close()


# -- 4: staged items belong to their stager ----------------------------------------------------

def test_another_connection_cannot_commit_staged_ids_without_their_grant(cluster):
    with Client(cluster.master_addr, timeout_s=10) as producer:
        staged = producer.stage("acct", [b"abandoned-1", b"abandoned-2"])
        ids = [i for chunk in staged for i in chunk[0]]
        nodes = sorted({n for chunk in staged for n in chunk[1]})
        ep = cluster.endpoint(cluster.master_addr)  # an attacker's client key, another connection
        try:
            with pytest.raises(Forbidden, match="grants"):  # ids are sequential: easy to name
                call(ep, p.Commit(ids, nodes, "steal-1"), 5)
            own = call(ep, p.Place(1, []), 5)  # a grant of its own covers other ids
            with pytest.raises(Forbidden, match="grants"):
                call(ep, p.Commit(ids, nodes, "steal-2", [own.grant]), 5)
            forged = p.PutGrant(ids[0], len(ids), own.grant.nodes, own.grant.key_id,
                                own.grant.expiry, own.grant.mac)  # widened to cover them
            with pytest.raises(Forbidden, match="signature"):
                call(ep, p.Commit(ids, nodes, "steal-3", [forged]), 5)
        finally:
            ep.close()
        assert producer.stats("acct")["ready"] == 0 and producer.stats("acct")["pending"] == 2
    # whoever holds the grants commits, from any connection (a Spark driver does)
    with Client(cluster.master_addr, timeout_s=10) as driver:
        driver.commit(staged)
        assert driver.stats("acct")["ready"] == 2


def test_a_commit_plan_keeps_the_grants_of_its_ids():
    grant = [p.PutGrant(first, 10, ["a"], 1, 0.0, b"m" * 16) for first in (0, 10, 20)]
    assert covering(grant, [12, 25]) == grant[1:]
    assert covering(grant, [9]) == grant[:1]
    assert covering(grant, [30, 31]) == []


# -- 5: a put grant only adds blobs the master hears of ----------------------------------------

def test_a_granted_put_must_report_and_an_unenqueued_blob_is_deleted_in_time(cluster_factory):
    pending_s = 1.0
    cluster = cluster_factory(datanodes=1, replication=1, heartbeat_s=0.2, dead_after_s=1.5,
                              master_args=["--pending-timeout-s", str(pending_s)])
    ep = cluster.endpoint(cluster.master_addr)
    try:
        placement = call(ep, p.Place(2, []), 5)
    finally:
        ep.close()
    (node,) = placement.nodes
    ep = cluster.endpoint(node.addr)
    try:  # unreported, the master would never hear of it: refused, nothing stored
        with pytest.raises(Forbidden, match="report"):
            call(ep, _put(placement, node, b"silent", report=False), 5)
        assert placement.first not in _held(cluster, node)
        ep.send(_put(placement, node, b"never enqueued", report=True))  # reported, no reply
        wait_for(lambda: placement.first in _held(cluster, node), 10, "the reported put")
    finally:
        ep.close()
    # nobody enqueues it: once its block expires the master has the node delete it
    wait_for(lambda: placement.first not in _held(cluster, node), pending_s + 10,
             "the blob of an id never enqueued to be deleted")


def test_a_put_grant_cannot_rewrite_or_delete_an_enqueued_item(cluster):
    master = cluster.endpoint(cluster.master_addr)
    nodes = {}
    try:
        placement = call(master, p.Place(1, []), 5)
        nodes = {node.node_id: cluster.endpoint(node.addr) for node in placement.nodes}
        for node in placement.nodes:  # reported puts get no reply: the enqueue waits on them
            nodes[node.node_id].send(_put(placement, node, b"original", report=True))
        enqueue = p.Enqueue("acct", placement.ids, [len(b"original")],
                            [zlib.crc32(b"original")], [0], [0.0], [""], False, "enq-1", False,
                            5.0, placement.grant)
        assert call(master, enqueue, 10) == p.Committed(1)
        for node in placement.nodes:  # the grant is still valid: it must touch nothing now
            nodes[node.node_id].send(_put(placement, node, b"rewritten", report=True))
            # answered after the put above was taken up (one connection, in order)
            with pytest.raises(Forbidden):
                call(nodes[node.node_id], p.Delete(placement.ids, placement.grant), 5)
            assert placement.first in _held(cluster, node)
    finally:
        master.close()
        for ep in nodes.values():
            ep.close()
    with Client(cluster.master_addr, timeout_s=10) as c:
        got = c.dequeue("acct", wait_s=2)
        assert got is not None and got.id == placement.first and got.data == b"original"
        got.ack(wait=True)
