"""Suspect data nodes (``master/nodes/membership.py``): silent a few heartbeats. They are placed
only to make up a shortfall, listed after healthy replicas, never a write's hedge, and named
to clients; nothing a client does makes a healthy node suspect. The time is passed in."""

from __future__ import annotations

from master.nodes.membership import MAX_SUSPECTS, MIN_FREE_BYTES, NAMED_DEAD_S, Membership

ROOM = MIN_FREE_BYTES * 2


def members(*names: str, now: float = 0.0) -> Membership:
    m = Membership(dead_after_s=5.0, suspect_after_s=1.0)
    for name in names:
        m.heartbeat(name, f"tcp://127.0.0.1:{9000 + len(m.nodes)}", 0, 0, ROOM, now)
    return m


def beat(m: Membership, now: float, *names: str) -> None:
    for name in names:
        m.heartbeat(name, m.nodes[name].addr, 0, 0, ROOM, now)


def test_a_node_silent_past_suspect_after_is_suspect_then_dead():
    m = members("a", "b")
    beat(m, 2.0, "a")  # b last heard of at 0
    assert m.suspects(0.5) == [] and m.suspects(2.1) == ["b"]
    assert m.suspects(6.0) == ["a", "b"]  # dead ones are named too (a: silent 4 s, suspect)
    beat(m, 6.0, "a", "b")  # a heartbeat makes a node healthy again
    assert m.suspects(6.1) == []
    assert m.suspects(6.1 + 5.0 + NAMED_DEAD_S) == []  # long dead: no longer named


def test_placement_leaves_suspects_out_while_enough_healthy_nodes_are_left():
    m = members("a", "b", "c", "d")
    beat(m, 1.5, "a", "c", "d")  # b silent for 1.5 s: suspect
    for _ in range(8):  # whatever the rotation
        assert "b" not in {n.node_id for n in m.place(3, set(), 1.6)}
    # too few healthy nodes: the suspect makes up the shortfall (better than no write)
    assert {n.node_id for n in m.place(4, set(), 1.6)} == {"a", "b", "c", "d"}
    assert {n.node_id for n in m.place(3, {"a"}, 1.6)} == {"b", "c", "d"}


def test_spares_for_a_hedge_are_healthy_and_outside_the_placement():
    m = members("a", "b", "c", "d", "e")
    beat(m, 1.5, "a", "b", "c", "e")  # d silent: suspect
    assert [n.node_id for n in m.spares(2, {"a", "b", "c"}, 1.6)] == ["e"]
    assert m.spares(1, {"a", "b", "c", "e"}, 1.6) == []  # never a suspect one


def test_replicas_are_listed_healthy_then_suspect_then_dead():
    m = members("a", "b", "c")
    beat(m, 1.5, "b", "c")  # a silent: suspect
    refs = m.refs(("a", "gone", "b"), {"gone": "tcp://127.0.0.1:9"}, now=1.6)
    assert [r.node_id for r in refs] == ["b", "a", "gone"]


def test_the_suspects_named_to_clients_are_bounded():
    m = members(*[f"n{i:03d}" for i in range(MAX_SUSPECTS + 20)])
    assert len(m.suspects(2.0)) == MAX_SUSPECTS
