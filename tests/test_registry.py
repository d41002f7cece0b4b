"""The servers' one registry of handlers (``blizzard/server/registry.py``): the dispatch tables
and the allow-lists are made from the routes, each op is routed once, and each handler logs
only the records its route declares.
"""

from __future__ import annotations

import time
from operator import attrgetter

import pytest

from blizzard.server.registry import ADMIN, CLIENT, ROLES, STANDBY, Route, Routes
from blizzard.wire import protocol as p
from blizzard.wire.errors import Forbidden, ForeignCluster
from datanode import meta
from datanode import server as datanode_server
from datanode.grants import DELETERS
from master import server as master_server
from master.server import ADMIN_OPS, ALLOWED, NODE_OPS, ROUTES
from master.state import records

from support.in_process_master import call, enqueue_msg, in_process_master


@pytest.fixture
def master():
    server = in_process_master(replication=1)
    yield server
    server.close()


def test_an_op_routed_twice_or_to_no_role_is_refused_when_the_table_is_made():
    with pytest.raises(ValueError, match="Ping is routed twice"):
        Routes([Route(p.Ping, "ping", ROLES), Route(p.Ping, "pong", (CLIENT,))])
    with pytest.raises(ValueError, match="needs roles"):
        Routes([Route(p.Ping, "ping", ())])
    with pytest.raises(ValueError, match="needs roles"):
        Routes([Route(p.Ping, "ping", ("root",))])


@pytest.mark.parametrize("routes", [master_server.ROUTES, datanode_server.ROUTES],
                         ids=["master", "datanode"])
def test_every_route_names_a_request_roles_and_records(routes):
    for route in routes:
        assert p.op_of(route.op) >= 0  # a message of the wire format
        assert route.roles and set(route.roles) <= set(ROLES)
        assert all(isinstance(rec, type) and rec.__module__ == records.__name__
                   for rec in route.logs)


def test_the_masters_dispatch_table_is_its_routes_bound(master):
    assert master.handlers.keys() == ROUTES.by_op.keys()
    for op, route in ROUTES.by_op.items():
        assert master.handlers[op] == attrgetter(route.serve)(master), op.__name__


def test_the_datanodes_dispatch_table_is_its_routes_bound():
    routes = datanode_server.ROUTES
    assert {op.__name__ for op in routes.by_op} == {"Put", "Get", "ListMeta", "Delete"}
    assert all(callable(getattr(datanode_server.DatanodeServer, r.serve)) for r in routes)
    # the roles that may list and delete are the ones those requests are checked against
    assert routes.by_op[p.ListMeta].roles is meta.READERS
    assert routes.by_op[p.Delete].roles is DELETERS


def test_the_allow_list_is_made_from_the_routes():
    assert ALLOWED is ROUTES.allowed
    for role in ROLES:
        assert ALLOWED[role] == {r.op for r in ROUTES if role in r.roles}
    assert NODE_OPS == {p.Heartbeat, p.PutReport, p.Replicated, p.Inventory, p.AwaitServes}
    assert ALLOWED[STANDBY] - ALLOWED[CLIENT] == {p.Follow}
    assert ADMIN_OPS <= ALLOWED[ADMIN] and not ADMIN_OPS & ALLOWED[CLIENT]
    assert ALLOWED[CLIENT] < ALLOWED[ADMIN]  # an admin may do what a client may, and more


@pytest.mark.parametrize("role", ROLES)
def test_each_key_is_refused_every_op_its_role_is_not_routed(master, role):
    master.router.roles = {b"peer": role}
    for op in set(ROUTES.by_op) - ALLOWED[role]:
        msg = op(*[None] * len(p.fields_of(op)))
        if op is p.Configure and role == CLIENT:
            continue  # a client may create a queue, with a ``Configure`` (``create``)
        reply = master.handle(b"peer", 1, msg, time.time(), time.monotonic())
        assert isinstance(reply, p.Error) and reply.code == Forbidden.code, op.__name__


def test_a_client_key_cannot_send_a_data_nodes_heartbeat_or_report(master):
    master.router.roles = {b"c": CLIENT}
    for msg in (p.Heartbeat("dn-a", "tcp://127.0.0.1:1", 0, 0, 10**12),
                p.PutReport("dn-a", [1], [], "")):
        reply = master.handle(b"c", 1, msg, time.time(), time.monotonic())
        assert reply.code == Forbidden.code and "only data nodes" in reply.message
    reply = master.handle(b"c", 1, p.Purge("q"), time.time(), time.monotonic())
    assert reply.code == Forbidden.code and "admin key" in reply.message


def test_a_heartbeat_passes_every_step_of_its_chain(master):
    reply = call(master, p.Heartbeat("dn-b", "tcp://127.0.0.1:2", 0, 0, 10**12), b"dn-b")
    assert isinstance(reply, p.HeartbeatReply)
    assert reply.cluster_id == master.state.cluster_id  # master/nodes/cluster_id.py
    assert reply.epoch == master.state.epoch and reply.epoch_proof == \
        master.replication.proof.make(master.state.cluster_id, master.state.epoch)
    assert master.state.node_addrs["dn-b"] == "tcp://127.0.0.1:2"  # registered
    foreign = p.Heartbeat("dn-c", "tcp://127.0.0.1:3", 0, 0, 10**12, "another-cluster")
    assert master.handle(b"dn-c", 1, foreign, time.time(), time.monotonic()).code == \
        ForeignCluster.code
    assert "dn-c" not in master.state.node_addrs  # refused before it was registered


def test_each_request_logs_only_the_records_its_route_declares(master):
    """A producer's and a consumer's life through the handlers, and an operator's: each
    request's WAL records are among those its route names."""
    logged: list[type] = []
    saw = master.meta_sync.saw
    master.meta_sync.saw = lambda rec: (logged.append(type(rec)), saw(rec))
    seen: dict[type, set[type]] = {}

    def ask(msg, peer=b"peer"):
        logged.clear()
        reply = call(master, msg, peer)
        seen.setdefault(type(msg), set()).update(logged)
        assert set(logged) <= set(ROUTES.by_op[type(msg)].logs), (type(msg).__name__, logged)
        return reply

    ask(p.Hello())
    ask(p.Ping())
    ask(p.Heartbeat("dn-b", "tcp://127.0.0.1:2", 0, 0, 10**12), b"dn-b")
    placement = ask(p.Place(6, []))
    node = placement.nodes[0].node_id
    ask(p.PutReport(node, placement.ids, [], ""), node.encode())
    assert ask(enqueue_msg(placement.ids, request="e1")) == p.Committed(6)
    ask(p.Configure("q", False, None, 5, None, None, None, None, None))
    leased = ask(p.Lease("q", 4, 30.0, 0.0, "l1", [], []))
    ids, leases = leased.ids, leased.leases
    ask(p.Extend(ids[:1], leases[:1], 60.0, "q"))
    ask(p.Regrant(ids[:1], leases[:1]))
    ask(p.Nack(ids[1:2], leases[1:2], 0.0, "try again", "q"))
    ask(p.Ack(ids[:1], leases[:1], False, "q"))
    ask(p.Bury(ids[2:3], leases[2:3], "gone bad"))
    ask(p.Lease("q", 1, 30.0, 0.0, "l2", ids[3:4], leases[3:4]))
    for msg in (p.Stats("q"), p.ListQueues("", 10), p.Status(), p.Peek("q", 5),
                p.Lookup(ids), p.TaskStats("q"), p.Head("q")):
        ask(msg)
    ask(p.Redrive("q.dead" if "q.dead" in master.state.queues else "q", 10))
    ask(p.DeleteItem("q", placement.ids[-1], True))
    ask(p.Purge("q"))
    ask(p.DeleteQueue("q", True))
    walked = {records.Reserve, records.CommitItems, records.ConfigureQueue, records.LeaseItems,
              records.AckItems, records.ReleaseItems, records.BuryItems, records.RedriveItems,
              records.NodeSeen, records.DeleteItems, records.DeleteQueue}
    assert walked <= set().union(*seen.values())  # the walk above did log them
