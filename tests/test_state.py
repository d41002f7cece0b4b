"""The master's state machine: ordering, leases, expiry, and exact replay."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blizzard.wire import protocol as p
from master.log import checkpoint_file
from master.state import records
from master.state.machine import State
from master.state.records import (
    AckItems,
    CommitItems,
    LeaseItems,
    NodeSeen,
    RedriveItems,
    ReleaseItems,
    Reserve,
)


def commit(state: State, queue: str, ids: list[int], priorities: list[int] | None = None,
           at: float = 100.0) -> CommitItems:
    rec = CommitItems(queue=queue, ids=ids, sizes=[1] * len(ids), crcs=[0] * len(ids),
                      priorities=priorities or [0] * len(ids), not_befores=[0.0] * len(ids),
                      keys=[""] * len(ids), coalesce=False, nodes=["dn-a"], at=at, request="")
    state.apply(rec)
    return rec


def lease(state: State, queue: str, n: int, now: float, lease_s: float = 10.0) -> list[int]:
    ids = state.head(queue, n, now)
    first = state.lease_seq + 1
    state.apply(LeaseItems(ids=ids, leases=list(range(first, first + len(ids))),
                           deadline=now + lease_s, request=""))
    return ids


def test_fifo_within_a_priority_and_lower_priority_first():
    s = State()
    commit(s, "q", [1, 2, 3, 4, 5], priorities=[5, 0, 5, 0, 1])
    assert s.head("q", 10, 0.0) == [2, 4, 5, 1, 3]
    assert s.head("q", 2, 0.0) == [2, 4]
    assert s.head("other", 10, 0.0) == []


def test_head_is_a_query_and_lease_takes_items_out():
    s = State()
    commit(s, "q", [1, 2, 3])
    assert s.head("q", 2, 0.0) == s.head("q", 2, 0.0) == [1, 2]
    assert lease(s, "q", 2, 0.0) == [1, 2]
    assert s.head("q", 10, 0.0) == [3]
    q = s.queues["q"]
    assert (q.n_ready, q.n_leased) == (1, 2)


def test_ack_forgets_and_release_counts_an_attempt():
    s = State()
    commit(s, "q", [1, 2])
    lease(s, "q", 2, 0.0)
    s.apply(AckItems(ids=[1]))
    s.apply(ReleaseItems(ids=[2], not_befores=[0.0], error=""))
    assert 1 not in s.items
    assert s.items[2].attempts == 1
    assert s.head("q", 10, 0.0) == [2]


def test_delayed_release_becomes_ready_at_its_time():
    s = State()
    commit(s, "q", [1])
    lease(s, "q", 1, 0.0)
    s.apply(ReleaseItems(ids=[1], not_befores=[50.0], error=""))
    assert s.head("q", 1, 49.9) == []
    assert s.queues["q"].n_delayed == 1
    assert s.head("q", 1, 50.0) == [1]
    assert (s.queues["q"].n_delayed, s.queues["q"].n_ready) == (0, 1)


def test_expired_leases_are_reported_once():
    s = State()
    commit(s, "q", [1, 2])
    lease(s, "q", 1, 0.0, lease_s=5.0)
    lease(s, "q", 1, 0.0, lease_s=50.0)
    assert s.expired(4.9) == []
    assert s.expired(5.0) == [1]
    s.apply(ReleaseItems(ids=[1], not_befores=[0.0], error=""))
    assert s.expired(100.0) == [2]


def test_reserve_moves_the_high_water_mark_only_up():
    s = State()
    s.apply(Reserve(id_hi=1000))
    s.apply(Reserve(id_hi=10))
    assert s.id_hi == 1000
    commit(s, "q", [5000])
    assert s.id_hi == 5001


ops = st.lists(st.one_of(
    st.tuples(st.just("commit"), st.sampled_from("ab"), st.integers(1, 5), st.integers(-2, 2)),
    st.tuples(st.just("lease"), st.sampled_from("ab"), st.integers(1, 4), st.floats(0.5, 20)),
    st.tuples(st.just("ack"), st.integers(0, 50)),
    st.tuples(st.just("release"), st.integers(0, 50), st.sampled_from([0.0, 3.0])),
    st.tuples(st.just("tick"), st.floats(0.1, 10)),
    st.tuples(st.just("node"), st.sampled_from(["dn-a", "dn-b"]), st.sampled_from(["tcp://x:1", "tcp://x:2"])),
), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_replaying_the_log_rebuilds_the_same_state(script):
    live, log = State(), []
    now, next_id = 1000.0, 1

    def do(rec):
        live.apply(rec)
        log.append(records.pack(rec))

    for op in script:
        if op[0] == "commit":
            _, queue, n, prio = op
            do(Reserve(id_hi=next_id + n))
            do(CommitItems(queue=queue, ids=list(range(next_id, next_id + n)), sizes=[3] * n,
                           crcs=[1] * n, priorities=[prio] * n, not_befores=[0.0] * n,
                           keys=[""] * n, coalesce=False, nodes=["dn-a"], at=now,
                           request=f"c{next_id}"))
            next_id += n
        elif op[0] == "lease":
            ids = live.head(op[1], op[2], now)
            if ids:
                first = live.lease_seq + 1
                do(LeaseItems(ids=ids, leases=list(range(first, first + len(ids))),
                              deadline=now + op[3], request=f"r{len(log)}"))
        elif op[0] in ("ack", "release"):
            leased = sorted(i for i in live.items if live.lease_of(i))
            if leased:
                target = leased[op[1] % len(leased)]
                do(AckItems(ids=[target]) if op[0] == "ack"
                   else ReleaseItems(ids=[target], not_befores=[now + op[2] if op[2] else 0.0],
                                     error="nack"))
        elif op[0] == "tick":
            now += op[1]
            expired = live.expired(now)
            if expired:
                do(ReleaseItems(ids=expired, not_befores=[0.0] * len(expired), error=""))
        else:
            do(NodeSeen(op[1], op[2]))
    replayed = State()
    for body in log:
        replayed.apply(records.unpack(body))
    for state in (live, replayed):
        for q in state.queues.values():
            state.promote_due(q, now)
    assert replayed.snapshot() == live.snapshot()
    for name in live.queues:
        assert replayed.head(name, 100, now) == live.head(name, 100, now)


@settings(max_examples=100, deadline=None)
@given(ops, st.integers(0, 200))
def test_checkpoint_plus_wal_tail_rebuilds_the_same_state(script, cut):
    live, log = State(), []
    now, next_id = 1000.0, 1
    for op in script:  # a simpler driver than above: commits, leases, acks, expiries
        if op[0] == "commit":
            _, queue, n, prio = op
            recs = [Reserve(id_hi=next_id + n),
                    CommitItems(queue=queue, ids=list(range(next_id, next_id + n)), sizes=[1] * n,
                                crcs=[0] * n, priorities=[prio] * n, not_befores=[0.0] * n,
                                keys=[""] * n, coalesce=False, nodes=["dn-a"], at=now,
                                request=f"c{next_id}")]
            next_id += n
        elif op[0] == "lease" and (ids := live.head(op[1], op[2], now)):
            first = live.lease_seq + 1
            recs = [LeaseItems(ids=ids, leases=list(range(first, first + len(ids))),
                               deadline=now + op[3], request=f"r{len(log)}")]
        elif op[0] == "ack" and (leased := sorted(i for i in live.items if live.lease_of(i))):
            recs = [AckItems(ids=[leased[op[1] % len(leased)]])]
        elif op[0] == "tick":
            now += op[1]
            recs = ([ReleaseItems(ids=e, not_befores=[now + 1.0] * len(e), error="x")]
                    if (e := live.expired(now)) else [])
        else:
            recs = []
        for rec in recs:
            live.apply(rec)
            log.append(records.pack(rec))
    cut = min(cut, len(log))
    before = State()
    for body in log[:cut]:
        before.apply(records.unpack(body))
    body = b"".join(map(p.dumps, before.export_parts()))
    restored = State.restore(p.iter_loads(body))
    for body in log[cut:]:
        restored.apply(records.unpack(body))
    for state in (live, restored):
        for q in state.queues.values():
            state.promote_due(q, now)
    assert restored.snapshot() == live.snapshot()
    assert restored.expired(now + 1e6) == live.expired(now + 1e6)


def test_a_checkpoint_from_before_named_rows_still_loads(tmp_path):
    # Given a checkpoint as the first masters wrote it: a positional header, queue settings
    # as [name, *values] and item rows as bare columns
    header = [40, 7, {"dn-a": "tcp://127.0.0.1:1"}, [["r1", [3], [7]]], ["c1"],
              [["q", 5.0, 3, "", 0.0, 300.0, 0.0, 0]], [[9, 6]], 4]
    rows = [[1, "q", 10, 11, 0, 1, "", ["dn-a"], 0, 100.0, 0, 0, 0.0, 0.0, "", ""],
            [2, "q", 20, 21, 1, 2, "k", ["dn-a"], 1, 100.0, 1, 0, 0.0, 500.0, "", "boom"],
            [3, "q", 30, 31, 0, 3, "", ["dn-a"], 0, 100.0, 2, 7, 130.0, 0.0, "", ""],
            [4, "q.dead", 40, 41, 0, 4, "", ["dn-a"], 3, 100.0, 0, 0, 0.0, 0.0, "q", "bad"]]
    path = checkpoint_file.write(str(tmp_path), 1, [header, *rows])
    # When the master of today loads it
    _, parts = checkpoint_file.read(path)
    s = State.restore(parts)
    # Then every item, lease, delay and queue setting is back, and it serves as before
    assert (s.id_hi, s.lease_seq, s.node_addrs) == (40, 7, {"dn-a": "tcp://127.0.0.1:1"})
    assert s.config("q").lease_s == 5.0 and s.config("q").max_attempts == 3
    assert list(s.recent_acks.items()) == [(9, 6)] and s.leased_by("r1") == [3]
    assert (s.items[1].size, s.items[1].crc, s.items[1].nodes) == (10, 11, ("dn-a",))
    assert s.head("q", 10, 0.0) == [1] and s.head("q", 10, 500.0) == [1, 2]
    assert s.expired(130.0) == [3] and s.lease_of(3) == 7
    assert (s.origins, s.errors) == ({4: "q"}, {2: "boom", 4: "bad"})
    s.apply(RedriveItems(ids=[4]))
    assert s.items[4].queue == "q" and s.items[4].attempts == 0
    # and written again, it is the named layout, which reads back the same
    again = State.restore(p.iter_loads(b"".join(map(p.dumps, s.export_parts()))))
    assert again.snapshot() == s.snapshot()


def test_checkpoint_rows_are_read_by_name():
    s = State()
    commit(s, "q", [1, 2])
    header, *rows = s.export_parts()
    assert isinstance(header, dict) and header["item_fields"][:2] == ["id", "queue"]
    # a checkpoint whose rows have their columns in another order and lack optional ones
    fields = ["queue", "id", "size", "crc", "priority", "order", "key", "nodes", "enqueued_at"]
    picked = [[row[header["item_fields"].index(f)] for f in fields] for row in rows]
    restored = State.restore([{**header, "item_fields": fields}, *picked])
    assert restored.snapshot() == s.snapshot()
    with pytest.raises(ValueError, match="does not know"):
        State.restore([{**header, "item_fields": [*header["item_fields"], "colour"]},
                       *[[*row, "red"] for row in rows]])
    with pytest.raises(ValueError, match="newer"):
        State.restore([{**header, "version": 99}, *rows])


def test_an_items_own_lease_and_a_release_at_a_new_priority_replay_and_checkpoint():
    s = State()
    rec = CommitItems(queue="q", ids=[1, 2], sizes=[1, 1], crcs=[0, 0], priorities=[0, 0],
                      not_befores=[0.0, 0.0], keys=["", ""], coalesce=False, nodes=["dn-a"],
                      at=100.0, request="", ttrs=[600.0, 0.0])
    records_applied = [rec, LeaseItems(ids=[1, 2], leases=[5, 6], deadline=130.0, request="r",
                                       deadlines=[700.0, 130.0]),
                       ReleaseItems(ids=[2], not_befores=[0.0], error="", priorities=[-5])]
    for r in records_applied[:2]:
        s.apply(records.unpack(records.pack(r)))
    assert s.leased_by("r") == [1, 2]  # one record, two deadlines
    s.apply(records.unpack(records.pack(records_applied[2])))
    assert s.ttrs == {1: 600.0}
    assert s.held[1] == (5, 700.0) and s.expired(200.0) == []  # its own deadline
    assert s.items[2].priority == -5 and s.head("q", 5, 0.0) == [2]
    again = State.restore(s.export_parts())
    assert again.snapshot() == s.snapshot() and again.ttrs == s.ttrs
    s.apply(AckItems(ids=[1]))
    assert s.ttrs == {}
