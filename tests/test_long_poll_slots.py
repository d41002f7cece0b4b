"""Long-poll slots on a real secure cluster: one key's many connections cannot take every
slot, and the slots of connections that left come back (issue 32, item 9)."""

from __future__ import annotations

import itertools
import time

import zmq
import zmq.auth

from blizzard import Client
from blizzard.local.harness import LocalCluster
from blizzard.wire import protocol as p
from master.consume.leases import MAX_WAITERS, MAX_WAITERS_PER_KEY, MAX_WAITERS_PER_PEER

QUEUE = "slots"
_requests = itertools.count()


def park(cluster: LocalCluster, connections: int, key: str) -> tuple[list[zmq.Socket], int, int]:
    """Open ``connections`` connections with ``key``, each asking for its share of long
    polls on the empty queue; (the sockets, long polls parked, long polls refused)."""
    socks = [cluster.dealer(cluster.master_addr, key) for _ in range(connections)]
    for sock in socks:
        for _ in range(MAX_WAITERS_PER_PEER):
            sock.send(p.encode(0, p.Lease(QUEUE, 1, 30.0, 60.0, f"r{next(_requests)}", [], [])))
        sock.send(p.encode(1, p.Hello()))  # answered after the leases before it were handled
    refused = 0
    deadline = time.monotonic() + 60
    for sock in socks:
        while True:
            assert sock.poll(max(1, int((deadline - time.monotonic()) * 1000))), "no Welcome"
            rid, reply = p.decode(sock.recv())
            if isinstance(reply, p.Welcome):
                break
            assert isinstance(reply, p.Error) and reply.code == "too_many_items", reply
            refused += 1
    return socks, connections * MAX_WAITERS_PER_PEER - refused, refused


def close(socks: list[zmq.Socket]) -> None:
    for sock in socks:
        sock.close(linger=0)


def test_one_key_cannot_take_every_slot_and_slots_come_back(cluster_factory, tmp_path):
    # Given a secure cluster with two client keys, and an empty queue
    keys = str(tmp_path / "keys")
    cluster = cluster_factory(datanodes=1, replication=1, keys=keys)
    zmq.auth.create_certificates(keys, "client-other")
    with Client(cluster.masters, keys=keys) as client:
        client.create_queue(QUEUE)
    # When one key opens enough connections to fill every slot with long polls
    attackers = MAX_WAITERS // MAX_WAITERS_PER_PEER + 1
    socks, parked, refused = park(cluster, attackers, "client")
    # Then it holds its key's share only
    assert parked == MAX_WAITERS_PER_KEY
    assert refused == attackers * MAX_WAITERS_PER_PEER - MAX_WAITERS_PER_KEY
    # and another key's long polls still park
    others, parked_other, refused_other = park(cluster, 1, "client-other")
    assert (parked_other, refused_other) == (MAX_WAITERS_PER_PEER, 0)
    close(others)
    # When the first key's connections leave, its slots come back: new connections of the
    # same key park as many again
    close(socks)
    deadline = time.monotonic() + 20
    while True:
        again, parked, _ = park(cluster, MAX_WAITERS_PER_KEY // MAX_WAITERS_PER_PEER, "client")
        close(again)
        if parked == MAX_WAITERS_PER_KEY // MAX_WAITERS_PER_PEER * MAX_WAITERS_PER_PEER \
                or time.monotonic() > deadline:
            break
    assert parked == MAX_WAITERS_PER_KEY // MAX_WAITERS_PER_PEER * MAX_WAITERS_PER_PEER
