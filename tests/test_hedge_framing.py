"""Write hedges cannot be turned against others: a client that leaves nodes out of its puts
(one key, two connections) makes no healthy data node suspect for everyone, and a producer
holding ids places no new block per enqueue while the master names suspects. The master once
noted nodes slow from two connections' hedges, which one key could fake (found in review);
now only a node's own silence makes it suspect (``master/nodes/membership.py``)."""

from __future__ import annotations

import zlib

import pytest

from blizzard.client.core import Client
from blizzard.wire import protocol as p
from blizzard.wire.codec import as_ids

from support.sends import kinds, watch_sends

pytestmark = pytest.mark.cluster

BLOB = b"x"


def put_on_one(c: Client, pick: int) -> p.PutAlso | object:
    """An enqueue of one id whose payload goes to one placed node only (the ``pick``-th), not
    the others: what a framing client sends. The master's reply (a PutAlso naming the others)."""
    placement = c.master.call(p.Place(1, []))
    honest = placement.nodes[pick % len(placement.nodes)]
    c.datanodes.put_reported([honest], placement.grant, [placement.first], [BLOB],
                             [zlib.crc32(BLOB)], p.ItemMeta([], "q", 0, 0.0, "", 0, ""))
    return c.master.call(p.Enqueue("q", as_ids([placement.first]), [1], [zlib.crc32(BLOB)], [0],
                                   [0.0], [""], False, c.master.call_id(), False, 5.0,
                                   placement.grant), extra_s=5.0)


def frame_all(addr: str, rounds: int = 4) -> set[str]:
    """One client key, two connections, each leaving nodes out of its puts; the nodes named
    slow."""
    named: set[str] = set()
    with Client(addr) as one, Client(addr) as two:
        for k in range(rounds):
            for c in (one, two):
                reply = put_on_one(c, k)
                if isinstance(reply, p.PutAlso):
                    named.update(reply.slow)
    return named


def suspects(addr: str) -> list[str]:
    with Client(addr) as c:
        return c.master.call(p.Lease("probe", 1, 10.0, 0.0, c.master.call_id(), [], [])).suspects


def test_one_client_key_cannot_frame_healthy_nodes_as_slow(cluster_factory):
    # Given five healthy data nodes, R = W = 3
    cluster = cluster_factory(datanodes=5, replication=3, heartbeat_s=0.2, dead_after_s=5)
    # When one client key, over two connections, enqueues without putting to most placed nodes
    named = frame_all(cluster.master_addr)
    assert named  # (the master hedged those enqueues, naming the nodes left out)
    # Then the master suspects none of those healthy nodes
    assert suspects(cluster.master_addr) == [], "a client key framed healthy nodes as slow"


def test_a_producer_holding_ids_asks_no_placement_per_enqueue_while_nodes_are_suspect(
        cluster_factory, monkeypatch):
    # Given five data nodes, R = W = 3, that the master suspects while they all answer (framed
    # as above; anything that leaves fewer than R healthy nodes will do)
    cluster = cluster_factory(datanodes=5, replication=3, heartbeat_s=0.2, dead_after_s=5)
    frame_all(cluster.master_addr)
    sent = watch_sends(monkeypatch)
    # When a producer enqueues one item per call
    with Client(cluster.master_addr) as c:
        for i in range(50):
            c.enqueue("jobs", b"item-%d" % i)
    # Then it takes its ids from the block it holds (64 ids a place), not two places (and a
    # block of 64 ids left held at the master for pending-timeout-s) per enqueue: that hits the
    # master's cap of ids held per connection within seconds (TooManyItems)
    places = kinds(sent)["Place"]
    assert places <= 5, f"{places} places for 50 enqueues"
