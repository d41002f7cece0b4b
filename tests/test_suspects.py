"""Suspect data nodes (``master/membership.py``): silent a few heartbeats, or slow to store a
write. They are placed only to make up a shortfall, listed after healthy replicas, and named
to clients; the time is passed in."""

from __future__ import annotations

from master.membership import MAX_SUSPECTS, MIN_FREE_BYTES, SLOW_S, Membership

ROOM = MIN_FREE_BYTES * 2


def members(*names: str, now: float = 0.0) -> Membership:
    m = Membership(dead_after_s=5.0, suspect_after_s=1.0)
    for name in names:
        m.heartbeat(name, f"tcp://127.0.0.1:{9000 + len(m.nodes)}", 0, 0, ROOM, now)
    return m


def test_a_node_silent_past_suspect_after_is_suspect_then_dead():
    m = members("a", "b")
    m.heartbeat("a", "tcp://127.0.0.1:9000", 0, 0, ROOM, 2.0)  # b last heard of at 0
    assert m.suspects(0.5) == [] and m.suspects(1.5) == ["b"]
    assert m.suspects(6.0) == ["a", "b"]  # dead ones are named too (a: silent 4 s, suspect)


def slow(m: Membership, node: str, now: float = 0.0) -> None:
    """Two connections' writes saw ``node`` lag."""
    m.note_slow([node], now, b"client-1")
    m.note_slow([node], now, b"client-2")


def test_one_connection_cannot_frame_a_node_as_slow():
    m = members("a", "b")
    for _ in range(5):  # a client that never puts to b, enqueue after enqueue
        m.note_slow(["b"], 0.0, b"framer")
    assert m.suspects(0.1) == []
    m.note_slow(["b"], 0.2, b"another")  # a second connection's write saw it lag too
    assert m.suspects(0.3) == ["b"]
    for name in "ab":  # ... for SLOW_S
        m.heartbeat(name, m.nodes[name].addr, 0, 0, ROOM, SLOW_S + 0.25)
    assert m.suspects(SLOW_S + 0.3) == []


def test_placement_leaves_suspects_out_while_enough_healthy_nodes_are_left():
    m = members("a", "b", "c", "d")
    slow(m, "b")
    for _ in range(8):  # whatever the rotation
        assert "b" not in {n.node_id for n in m.place(3, set(), 0.1)}
    # too few healthy nodes: the suspect makes up the shortfall (better than no write)
    assert {n.node_id for n in m.place(4, set(), 0.1)} == {"a", "b", "c", "d"}
    assert {n.node_id for n in m.place(3, {"a"}, 0.1)} == {"b", "c", "d"}
    # a slow node is suspect for SLOW_S, then placed again (so measured again)
    for name in "abcd":
        m.heartbeat(name, m.nodes[name].addr, 0, 0, ROOM, SLOW_S)
    assert any("b" in {n.node_id for n in m.place(3, set(), SLOW_S + 0.1)} for _ in range(4))


def test_spares_for_a_hedge_are_healthy_and_outside_the_placement():
    m = members("a", "b", "c", "d", "e")
    slow(m, "d")
    spares = [n.node_id for n in m.spares(1, {"a", "b", "c"}, 0.1)]
    assert spares == ["e"]  # d is suspect: healthy spares come first
    # one suspect only of slowness still answers: better than waiting on a stopped node
    assert [n.node_id for n in m.spares(1, {"a", "b", "c", "e"}, 0.1)] == ["d"]
    for name in "abce":
        m.heartbeat(name, m.nodes[name].addr, 0, 0, ROOM, 1.5)
    assert m.spares(1, {"a", "b", "c", "e"}, 1.5) == []  # d silent past suspect_after_s


def test_replicas_are_listed_healthy_then_suspect_then_dead():
    m = members("a", "b", "c")
    slow(m, "a")
    refs = m.refs(("a", "gone", "b"), {"gone": "tcp://127.0.0.1:9"}, now=0.1)
    assert [r.node_id for r in refs] == ["b", "a", "gone"]


def test_the_suspects_named_to_clients_are_bounded():
    m = members(*[f"n{i:03d}" for i in range(MAX_SUSPECTS + 20)])
    assert len(m.suspects(2.0)) == MAX_SUSPECTS
