"""Fuzzing every server of a real cluster, every way in: no exits, no stalls, nothing changed
(P1, P7); and the checks themselves, which must be able to fail.

A short campaign here; ``scripts/fuzz`` runs the long one (10,000+ frames per server and way
in). What is compared before and after is ``chaos/fuzz/state.py``'s ``Durable``.
"""

from __future__ import annotations

from blizzard.wire import protocol as p
from chaos.fuzz.campaign import ADMITTED, REFUSED, Plan, run
from chaos.fuzz.frames import CATEGORIES
from chaos.fuzz.guard import Protected
from chaos.fuzz.raw import KINDS
from chaos.fuzz.state import Durable, differences

PLAN = Plan(frames=600, raw=400, hold=200, items=40, seed=7)


def test_fuzzing_every_server_every_way_in_changes_nothing(cluster_factory):
    cluster = cluster_factory(datanodes=2, replication=2, heartbeat_s=0.2, dead_after_s=1.5)
    lines: list[dict] = []
    problems = run(cluster, PLAN, lines.append)
    assert problems == [], f"{problems}\n{lines}"
    runs = {(line["target"], line["mode"]): line for line in lines if "target" in line}
    expected = {("master", m) for m in (*ADMITTED["master"], *REFUSED, "raw")}
    expected |= {(n.name, m) for n in cluster.nodes
                 for m in (*ADMITTED["datanode"], *REFUSED, "raw")}
    assert set(runs) == expected
    for (_target, mode), line in runs.items():
        if mode == "raw":
            assert line["connections"] == PLAN.raw and set(line["by_kind"]) == set(KINDS)
            assert line["probe_with_held_ms"] < 1000  # served promptly with 200 strangers held
            continue
        assert line["sent"] == PLAN.frames and set(line["by_category"]) == set(CATEGORIES)
        if mode in REFUSED:
            assert line["answered"] == 0  # nothing passes a refused handshake
        else:
            assert line["answered"] > PLAN.frames // 2  # errors or replies, most frames
    after = next(line for line in lines if line.get("phase") == "after")
    assert after["settled"] and after["differences"] == []


def _durable(**changes) -> Durable:
    base = dict(items={1: ("keep", 0, 1), 2: ("keep", 0, 2)},
                queues={"keep": ((), 2, 0, 0)},
                blobs={"datanode0": {1: 11, 2: 22}, "datanode1": {1: 11, 2: 22}}, verdict="ok")
    return Durable(**{**base, **changes})


def test_the_durable_comparison_sees_every_kind_of_change():
    before = _durable()
    assert differences(before, _durable()) == []
    assert differences(before, _durable(queues={"keep": ((), 2, 0, 0), "fz": ((), 0, 0, 0)})) == []
    assert differences(before, _durable(items={1: ("keep", 0, 1)}))
    assert differences(before, _durable(items={1: ("keep", 0, 1), 2: ("keep", 1, 2)}))
    assert differences(before, _durable(queues={"keep": ((("max_attempts", 3),), 2, 0, 0)}))
    assert differences(before, _durable(queues={"keep": ((), 2, 0, 0), "fz": ((), 1, 0, 0)}))
    assert differences(before, _durable(blobs={"datanode0": {1: 11}, "datanode1": {1: 11, 2: 22}}))
    assert differences(before, _durable(blobs={"datanode0": {1: 11, 2: 22, 9: 1},
                                               "datanode1": {1: 11, 2: 22}}))
    assert differences(before, _durable(blobs={"datanode0": {1: 11, 2: 23},
                                               "datanode1": {1: 11, 2: 22}}))
    assert differences(before, _durable(verdict="torn"))


def test_the_guard_spares_frames_naming_real_items_queues_and_nodes():
    guard = Protected.of({5, 6}, {"keep", "dn-real"})
    ref = p.NodeRef("dn-real", "tcp://127.0.0.1:9")
    touching = [p.Delete([2**40, 5], None), p.Put([6], [b"x"], [0], [], 1, "", True, None),
                p.Purge("keep"), p.Heartbeat("dn-real", "tcp://127.0.0.1:9", 0, 0, 0),
                p.Lease("q", 1, 1.0, 0.0, "r", [6], [1]), p.Inventory("dn-x", [5], True),
                p.HeartbeatReply([], [p.CopyOrder(ref, [7])], False, [])]
    for msg in touching:
        assert guard.touches([p.encode(1, msg)]), msg
    harmless = [p.Delete([2**40], None), p.Place(5, []), p.Peek("fz-q", 6), p.Purge("fz-q")]
    for msg in harmless:
        assert not guard.touches([p.encode(5, msg)]), msg
    assert not guard.touches([b"\x94\x01\x05"])
